"""The one-token GEMV (with its folded norm / bias / SwiGLU / residual) against the separate torch ops."""

from __future__ import annotations

import pytest
import torch

from roseinfer.kernels._common import is_interpret
from roseinfer.kernels.gemv import GemvTile, gemv, gemv_ref
from tests.kernels.kernel_utils import DEVICE, DTYPE_IDS, TOL, generator, randn

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# (norm, bias, gated, residual): each flag alone, and the combinations a decoder layer uses
FLAGS = [
    (False, False, False, False),
    (True, False, False, False),
    (False, True, False, False),
    (False, False, True, False),
    (False, False, False, True),
    (True, True, False, False),  # qkv(+norm) with a qkv bias (Qwen2)
    (True, False, True, False),  # gate_up(+norm, SwiGLU)
    (True, True, True, True),
]
FLAG_IDS = ["plain", "norm", "bias", "gated", "residual", "norm+bias", "norm+gated", "all"]


def _inputs(m: int, n: int, k: int, dtype: torch.dtype, flags: tuple[bool, ...], tag: str):
    norm, bias, gated, residual = flags
    g = generator("gemv", tag, m, n, k, dtype, flags)
    rows = 2 * n if gated else n
    x = randn((m, k), dtype, g)
    w = (randn((rows, k), dtype, g).float() / k**0.5).to(dtype)
    kwargs = {
        "bias": randn((rows,), dtype, g) if bias else None,
        "norm_weight": (1 + 0.1 * randn((k,), dtype, g).float()).to(dtype) if norm else None,
        "eps": 1e-6,
        "gated": gated,
        "residual": randn((m, n), dtype, g) if residual else None,
    }
    return x, w, kwargs


def _check(m: int, n: int, k: int, dtype: torch.dtype, flags: tuple[bool, ...], tile, tag: str) -> None:
    x, w, kwargs = _inputs(m, n, k, dtype, flags, tag)
    out = gemv(x, w, tile=tile, **kwargs)
    ref = gemv_ref(x, w, **kwargs)
    assert out.shape == (m, n) and out.dtype == dtype
    assert not torch.isnan(out).any(), "an output column was not written"
    atol, rtol = TOL[dtype]
    if dtype == torch.bfloat16 and is_interpret():
        # The interpreter truncates fp32 -> bf16 (the GPU rounds to nearest): the product, SiLU, gate * up and
        # residual roundings can each lose up to one ulp (2**-7) in the same direction.
        atol, rtol = 6e-2, 4e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("flags", FLAGS, ids=FLAG_IDS)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 7, 33), (1, 64, 96), (2, 45, 130), (1, 1, 1)])
def test_gemv_matches_separate_ops(dtype, flags, m, n, k):
    """Odd column counts leave a partial column tile; K not a multiple of the K tile leaves a partial step."""
    _check(m, n, k, dtype, flags, None, "default")


@pytest.mark.parametrize("flags", FLAGS, ids=FLAG_IDS)
@pytest.mark.parametrize(
    "tile",
    [GemvTile(8, 64, 1, 2), GemvTile(2, 16, 1, 3), GemvTile(16, 128, 2, 1)],
    ids=["8x64s2", "2x16s3", "16x128s1"],
)
def test_gemv_tiles(flags, tile):
    """Every tile shape the sweep may pick computes the same thing, including a K loop of many steps."""
    _check(1, 37, 300, torch.bfloat16, flags, tile, f"tile{tile}")


def test_gemv_empty_batch():
    x = torch.empty((0, 32), device=DEVICE)
    assert gemv(x, torch.ones((8, 32), device=DEVICE)).shape == (0, 8)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "kwargs", "match"),
    [
        ((1, 32), (8, 16), {}, "x \\[M, K\\] and weight \\[N, K\\]"),
        ((32,), (8, 32), {}, "x \\[M, K\\]"),
        ((1, 32), (7, 32), {"gated": True}, "even number of rows"),
        ((1, 32), (8, 32), {"bias": torch.ones(4)}, "bias must be \\[8\\]"),
        ((1, 32), (8, 32), {"norm_weight": torch.ones(31)}, "norm_weight must be \\[32\\]"),
        ((1, 32), (8, 32), {"gated": True, "residual": torch.ones(1, 8)}, "residual must be \\[1, 4\\]"),
    ],
)
def test_gemv_rejects_bad_shapes(x_shape, w_shape, kwargs, match):
    kwargs = {key: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for key, v in kwargs.items()}
    with pytest.raises(ValueError, match=match):
        gemv(torch.ones(x_shape, device=DEVICE), torch.ones(w_shape, device=DEVICE), **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("flags", FLAGS, ids=FLAG_IDS)
@pytest.mark.parametrize(
    ("n", "k"),
    [(6144, 4096), (14336, 4096), (4096, 14336), (1152, 896), (896, 4864), (151936, 896), (1001, 999)],
    ids=["llama-qkv", "llama-gate_up", "llama-down", "qwen-qkv", "qwen-down", "qwen-lm_head", "odd"],
)
def test_gemv_gpu(dtype, flags, n, k):
    """Real layer shapes with the tiles the engine picks on this GPU."""
    _check(1, n, k, dtype, flags, None, "gpu")
