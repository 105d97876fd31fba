"""Shared helpers for the kernel tests: devices, tolerances and random paged KV caches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roseinfer.kv.cache_dtype import to_cache_dtype

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")

# (atol, rtol) of a kernel's output against the fp32 reference computed from the same (rounded) inputs.
TOL = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (4e-3, 1e-2),
    torch.bfloat16: (2.5e-2, 2e-2),
}

DTYPE_IDS = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
}
FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]


def seed_of(*parts: object) -> int:
    """A stable seed that differs per parametrization."""
    text = "|".join(map(str, parts))
    h = 0
    for ch in text:
        h = (h * 131 + ord(ch)) % (2**31 - 1)
    return h


def generator(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(seed_of(*parts))


def randn(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype).to(DEVICE)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(out).any(), "output has NaN (an element was not written, or a bad read)"
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@dataclass
class PagedCache:
    kv: torch.Tensor  # [num_blocks, num_layers, 2, block_size, Hkv, D]
    k_cache: torch.Tensor  # kv[:, layer, 0]
    v_cache: torch.Tensor  # kv[:, layer, 1]
    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32
    block_size: int


def make_paged_cache(
    seq_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    num_layers: int = 2,
    layer: int = 1,
    extra_blocks: int = 3,
) -> PagedCache:
    """Random K/V for each sequence's `seq_lens[i]` tokens in shuffled blocks of a block-major cache.

    Everything the kernels must not read is NaN: slots past a sequence's length, the other layer, unused
    blocks, and block 0, which every unused block-table entry points at.
    """
    blocks_per_seq = [(n + block_size - 1) // block_size for n in seq_lens]
    max_blocks = max(max(blocks_per_seq), 1) + 1
    num_blocks = 1 + sum(blocks_per_seq) + extra_blocks
    kv = torch.full(
        (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype
    )
    perm = torch.randperm(num_blocks - 1, generator=gen) + 1
    tables = torch.zeros((len(seq_lens), max_blocks), dtype=torch.int32)
    used = 0
    for i, n in enumerate(seq_lens):
        blocks = perm[used : used + blocks_per_seq[i]]
        used += blocks_per_seq[i]
        tables[i, : blocks_per_seq[i]] = blocks.to(torch.int32)
        pos = torch.arange(n)
        kv[blocks[pos // block_size], layer, :, pos % block_size] = torch.randn(
            (n, 2, num_kv_heads, head_dim), generator=gen
        ).to(dtype)
    kv = kv.to(DEVICE)
    return PagedCache(
        kv=kv,
        k_cache=kv[:, layer, 0],
        v_cache=kv[:, layer, 1],
        block_tables=tables.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_size=block_size,
    )


def assert_fp8_close(got: torch.Tensor, want: torch.Tensor, max_off_share: float = 0.1) -> None:
    """`got`, fp8 cache rows, is `want` rounded to got's type, give or take one step of that type where `want`
    was itself rounded on its way (bf16 then fp8 against fp32 then fp8); no more than `max_off_share` of the
    elements may be off by that step."""
    exact = to_cache_dtype(want, got.dtype).float()
    g = got.float()
    assert not torch.isnan(g).any() and not torch.isinf(g).any()
    info = torch.finfo(got.dtype)
    step = torch.maximum(exact.abs(), g.abs()) * info.eps + info.tiny * info.eps
    assert ((g - exact).abs() <= step).all(), (g - exact).abs().max()
    assert (g != exact).float().mean().item() <= max_off_share


def head_major_copy(cache: torch.Tensor) -> torch.Tensor:
    """`cache` ([blocks, block_size, kv_heads, head_dim]) as a view of another layout: each block's heads
    outermost, so its strides differ from the block-major cache's in every dim but the last."""
    blocks, block_size, heads, dim = cache.shape
    other = torch.full((blocks, heads, block_size, dim), float("nan"), dtype=cache.dtype, device=cache.device)
    view = other.permute(0, 2, 1, 3)
    view.copy_(cache)
    assert view.stride()[:3] != cache.stride()[:3]
    return view
