"""The skinny decode GEMM (`kernels/skinny_gemm.py`) against the fp32 product, and its PDL chain on the GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from roseinfer.kernels._common import is_interpret
from roseinfer.kernels.pdl import pdl_supported
from roseinfer.kernels.skinny_gemm import (
    MAX_ROWS,
    GemmTile,
    padded_rows,
    skinny_gemm,
    skinny_gemm_ref,
    skinny_tile,
)
from tests.kernels.kernel_utils import DEVICE, DTYPE_IDS, HAS_CUDA, TOL, generator, randn

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    if dtype == torch.bfloat16 and is_interpret():
        return 4e-2, 3e-2  # the interpreter truncates to bf16 where the GPU rounds to nearest
    return TOL[dtype]


def _check(m: int, n: int, k: int, dtype: torch.dtype, tile: GemmTile | None, add: bool, pdl: bool = False):
    g = generator("skinny", m, n, k, dtype, tile, add)
    x = randn((m, k), dtype, g)
    w = (randn((n, k), dtype, g).float() / k**0.5).to(dtype)
    out = randn((m, n), dtype, g) if add else None
    expect = skinny_gemm_ref(x, w, out, add)
    got = skinny_gemm(x, w, out.clone() if add else None, add=add, pdl=pdl, tile=tile)
    assert got.shape == (m, n) and got.dtype == dtype
    assert torch.isfinite(got).all(), "an output element was not written"
    atol, rtol = _tolerance(dtype)
    torch.testing.assert_close(got.float(), expect.float(), atol=atol, rtol=rtol)


# K shares that end mid-tile, a share count that leaves the last shares empty, columns past a tile's edge
TILES = [GemmTile(16, 32, 1), GemmTile(32, 16, 2), GemmTile(16, 16, 3), GemmTile(32, 32, 8)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("tile", TILES, ids=str)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 7, 33), (5, 48, 80), (16, 33, 100), (17, 64, 48)])
@pytest.mark.parametrize("add", [False, True], ids=["store", "add"])
def test_skinny_gemm_matches_fp32_product(m, n, k, dtype, tile, add):
    _check(m, n, k, dtype, tile, add)


@pytest.mark.parametrize("add", [False, True], ids=["store", "add"])
def test_skinny_gemm_chosen_tile_and_max_rows(add):
    _check(MAX_ROWS, 40, 200, torch.float32, None, add)  # n < k: split-K with the chosen tile
    _check(MAX_ROWS, 200, 96, torch.float32, None, add)  # n > k: 64-deep K steps, the last one masked
    _check(3, 300, 64, torch.float32, None, add)


@pytest.mark.parametrize("tile", [GemmTile(16, 32, 1), GemmTile(16, 16, 3)], ids=str)
@pytest.mark.parametrize("add", [False, True], ids=["store", "add"])
def test_skinny_gemm_into_a_strided_out(tile, add):
    """`out` a column slice of a wider buffer (row stride > N): each share count writes rows at out's stride,
    and nothing beside the slice."""
    g = generator("skinny-strided-out", tile, add)
    m, n, k = 5, 24, 80
    x = randn((m, k), torch.float32, g)
    w = (randn((n, k), torch.float32, g) / k**0.5).contiguous()
    buf = randn((m, n + 9), torch.float32, g)
    before = buf.clone()
    out = buf[:, 4 : 4 + n]
    expect = skinny_gemm_ref(x, w, out.clone(), add)
    skinny_gemm(x, w, out, add=add, tile=tile)
    torch.testing.assert_close(out, expect, atol=1e-4, rtol=1e-4)
    assert torch.equal(buf[:, :4], before[:, :4]) and torch.equal(buf[:, 4 + n :], before[:, 4 + n :])


def test_skinny_tile_follows_the_sweep():
    """qwen2.5-0.5b's and llama-3.1-8b's four decode GEMMs on 132 SMs get the tiles the H100 sweeps found
    best: at 16-32 rows the isolated sweeps', at 64 rows (the default) qwen's deeper pipelines measured in the
    chain."""
    assert [padded_rows(m) for m in (1, 8, 16, 17, 32, 33, 64)] == [16, 16, 16, 32, 32, 64, 64]
    for block_m in (16, 32):
        assert skinny_tile(1152, 896, 132, block_m) == GemmTile(16, 128, 1, num_stages=4)
        assert skinny_tile(9728, 896, 132, block_m) == GemmTile(32, 128, 1, num_stages=3)
        assert skinny_tile(896, 896, 132, block_m) == GemmTile(16, 128, 1, num_stages=4)  # o: 16 columns
        assert skinny_tile(896, 4864, 132, block_m) == GemmTile(32, 256, 4, num_stages=4)
    # At 64 rows, shares of K under 2048: 64-deep steps for qkv and gate_up, 128-deep for o and down
    assert skinny_tile(1152, 896, 132) == GemmTile(16, 64, 1, num_stages=6)
    assert skinny_tile(9728, 896, 132) == GemmTile(32, 64, 1, num_stages=5)
    assert skinny_tile(896, 896, 132) == GemmTile(32, 128, 1, num_stages=5)
    assert skinny_tile(896, 4864, 132) == GemmTile(32, 128, 4, num_stages=5)
    assert skinny_tile(896, 2048, 132, 32) == GemmTile(32, 256, 2, num_stages=4)  # shares of at least 1024
    assert skinny_tile(4096, 8192, 132) == GemmTile(32, 256, 1, num_stages=4)  # 128 tiles fill the GPU
    # llama-3.1-8b: qkv, gate_up, o, down (K too long for the 64-row pipelines)
    for block_m in (32, 64):
        assert skinny_tile(6144, 4096, 132, block_m) == GemmTile(32, 128, 1, num_stages=4)
        assert skinny_tile(28672, 4096, 132, block_m) == GemmTile(64, 128, 1, num_stages=3)
        assert skinny_tile(4096, 4096, 132, block_m) == GemmTile(32, 256, 1, num_stages=4)
        assert skinny_tile(4096, 14336, 132, block_m) == GemmTile(32, 256, 1, num_stages=4)


def test_default_tiles_fit_the_shared_memory():
    """The sweep's bf16 tiles fit an H100's 227 KiB; in fp32 the same pipelines need twice that, so the tile
    drops to 3 stages, then halves its K step, until it fits."""
    from roseinfer.kernels.skinny_gemm import fit_shared_memory

    h100 = 232_448
    down = skinny_tile(896, 4864, 132, 32)
    assert fit_shared_memory(down, 64, 2, h100) == down  # 4 x (64 + 32) x 256 x 2 B = 192 KiB
    fp32_down = replace(down, block_k=128, num_stages=3)  # 3 x (64 + 32) x 128 x 4 B = 144 KiB
    assert fit_shared_memory(down, 64, 4, h100) == fp32_down
    assert fit_shared_memory(down, 64, 4, 100_000) == replace(down, block_k=64, num_stages=3)
    assert fit_shared_memory(down, 64, 4, None) == down  # no cap off CUDA
    tiny = fit_shared_memory(down, 64, 4, 1)  # nothing fits: the smallest pipeline, not an endless loop
    assert (tiny.block_k, tiny.num_stages) == (32, 1)
    deep = skinny_tile(896, 4864, 132)  # 5 x (64 + 32) x 128 x 2 B = 120 KiB; fp32 drops a stage
    assert fit_shared_memory(deep, 64, 2, h100) == deep
    assert fit_shared_memory(deep, 64, 4, h100) == replace(deep, num_stages=4)


def test_skinny_gemm_rejects_bad_input():
    x = torch.zeros((4, 8), device=DEVICE)
    w = torch.zeros((6, 8), device=DEVICE)
    with pytest.raises(ValueError, match="at most"):
        skinny_gemm(torch.zeros((MAX_ROWS + 1, 8), device=DEVICE), w)
    with pytest.raises(ValueError, match=r"x \[M, K\]"):
        skinny_gemm(x, torch.zeros((6, 9), device=DEVICE))
    with pytest.raises(ValueError, match="add needs"):
        skinny_gemm(x, w, add=True)
    with pytest.raises(ValueError, match="out must be"):
        skinny_gemm(x, w, out=torch.zeros((4, 7), device=DEVICE))
    with pytest.raises(ValueError, match="is torch.float16"):
        skinny_gemm(x.half(), w)


def test_skinny_gemm_empty_k_stores_zeros_or_leaves_out():
    x = torch.zeros((3, 0), device=DEVICE)
    w = torch.zeros((5, 0), device=DEVICE)
    out = torch.ones((3, 5), device=DEVICE)
    assert torch.equal(skinny_gemm(x, w, out.clone(), add=True), out)
    assert torch.equal(skinny_gemm(x, w, out.clone()), torch.zeros_like(out))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)  # fp32: the bf16 tiles must shrink to fit
@pytest.mark.parametrize("m", [2, 8, 33, 64])
@pytest.mark.parametrize(
    ("n", "k"), [(1152, 896), (896, 896), (9728, 896), (896, 4864), (4096, 4096), (64, 8192)]
)
def test_skinny_gemm_gpu_shapes(m, n, k, dtype):
    pdl = pdl_supported(DEVICE)
    for add in (False, True):
        _check(m, n, k, dtype, None, add, pdl)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or not pdl_supported(DEVICE), reason="needs an sm_90+ GPU")
def test_pdl_chain_in_a_graph_equals_plain_launches():
    """A chain where each GEMM reads the previous one's output (and adds into a shared stream), replayed as
    one CUDA graph with PDL launches: a wait in the wrong place would read a stale or half-written input."""
    g = generator("pdl-chain")
    hidden, wide = 896, 4864
    ws = [(randn((wide, hidden), torch.bfloat16, g) * hidden**-0.5, randn((hidden, wide), torch.bfloat16, g) * 0.02)
          for _ in range(12)]  # fmt: skip
    x0 = randn((64, hidden), torch.bfloat16, g)

    def chain(x: torch.Tensor, pdl: bool) -> None:
        for up, down in ws:
            h = skinny_gemm(x, up, pdl=pdl)
            skinny_gemm(h, down, out=x, add=True, pdl=pdl)

    expect = x0.clone()
    chain(expect, pdl=False)
    x = x0.clone()
    chain(x, pdl=True)  # compiles
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain(x, pdl=True)
    for _ in range(3):
        x.copy_(x0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(x, expect)
