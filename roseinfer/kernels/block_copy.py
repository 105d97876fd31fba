"""Copy whole KV-cache blocks (all layers, K and V) for a list of (src, dst) pairs in one launch.

With the block-major layout `[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]` one block is a
contiguous run of `num_layers * 2 * block_size * num_kv_heads * head_dim` elements, so copy-on-write of a
shared block is one flat memcpy per pair. Destinations must be distinct and must not be sources of other
pairs (the pairs run in parallel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roseinfer.kernels._common import cdiv, next_power_of_2
from roseinfer.kernels.direct_launch import DirectLaunch


@triton.jit
def _copy_blocks_kernel(
    cache_ptr,
    src_ptr,
    dst_ptr,
    block_numel,
    BLOCK: tl.constexpr,
):
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    src = tl.load(src_ptr + pair).to(tl.int64)
    dst = tl.load(dst_ptr + pair).to(tl.int64)
    numel = block_numel.to(tl.int64)
    # One program copies BLOCK elements of one pair; the grid's 2nd axis walks the block.
    start = chunk.to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < numel
    vals = tl.load(cache_ptr + src * numel + offs, mask=mask)
    tl.store(cache_ptr + dst * numel + offs, vals, mask=mask)


launcher = DirectLaunch(_copy_blocks_kernel)


def copy_blocks(kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """`kv_cache[dst[i]] = kv_cache[src[i]]` for every i, in one launch (`src`/`dst`: int64 [P] on the cache's device)."""
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous")
    if src.shape != dst.shape or src.dim() != 1:
        raise ValueError(
            f"src and dst must be 1-D of one shape, got {tuple(src.shape)} and {tuple(dst.shape)}"
        )
    num_pairs = src.shape[0]
    if num_pairs == 0:
        return
    block_numel = kv_cache[0].numel()
    # 16-byte accesses at 4 elements a thread for fp32, 8 for 16-bit types: 4096 elements per program is
    # 8-16 KiB moved each, enough to hide latency without starving the grid on a handful of pairs.
    block = min(4096, next_power_of_2(block_numel))
    grid = (num_pairs, cdiv(block_numel, block))
    launcher.run(grid, (kv_cache, src, dst, block_numel), {"BLOCK": block, "num_warps": 4})


def copy_blocks_ref(kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Plain-torch `copy_blocks`."""
    if src.numel() == 0:
        return
    kv_cache[dst.long()] = kv_cache[src.long()]
