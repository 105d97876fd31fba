"""Write one step's new K/V rows into the paged KV cache (one launch for every token of the step).

`k_cache`/`v_cache` are a layer's views `[num_blocks, block_size, num_kv_heads, head_dim]` of the block-major
cache (strided, last dim contiguous). Row `t` of `k`/`v` goes to slot `slot_mapping[t]`, i.e. block
`slot // block_size`, offset `slot % block_size`; a negative slot marks a padding row that is not written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roseinfer.kernels._common import cdiv, next_power_of_2
from roseinfer.kernels.cache_cast import to_cache
from roseinfer.kernels.direct_launch import DirectLaunch
from roseinfer.kv.cache_dtype import check_cache_dtype, to_cache_dtype


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    head_block = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    valid = slot >= 0
    safe_slot = tl.where(valid, slot, 0)
    blk = safe_slot // BLOCK_SIZE
    off = safe_slot % BLOCK_SIZE

    h = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = valid & (h[:, None] < NUM_HEADS) & (d[None, :] < HEAD_DIM)
    t64 = t.to(tl.int64)

    k = tl.load(k_ptr + t64 * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + t64 * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    kc = k_cache_ptr + blk * stride_kcb + off * stride_kcs + h[:, None] * stride_kch + d[None, :]
    vc = v_cache_ptr + blk * stride_vcb + off * stride_vcs + h[:, None] * stride_vch + d[None, :]
    tl.store(kc, to_cache(k, k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, to_cache(v, v_cache_ptr.dtype.element_ty), mask=mask)


launcher = DirectLaunch(_store_kv_kernel)


def _check_cache(cache: torch.Tensor, name: str) -> None:
    if cache.dim() != 4:
        raise ValueError(
            f"{name} must be [num_blocks, block_size, num_kv_heads, head_dim], got {tuple(cache.shape)}"
        )
    if cache.stride(-1) != 1:
        raise ValueError(f"{name}'s last dim must be contiguous")


def store_kv(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64 (or int32); < 0 = skip
) -> None:
    """Scatter `k`/`v` rows into the cache at `slot_mapping` in one launch; rows with a negative slot are skipped."""
    _check_cache(k_cache, "k_cache")
    _check_cache(v_cache, "v_cache")
    check_cache_dtype(k_cache.dtype, k.dtype)
    check_cache_dtype(v_cache.dtype, v.dtype)
    num_tokens, num_heads, head_dim = k.shape
    if v.shape != k.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if k_cache.shape[2:] != (num_heads, head_dim) or v_cache.shape != k_cache.shape:
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not fit k {tuple(k.shape)}")
    if slot_mapping.shape[0] < num_tokens:
        raise ValueError("slot_mapping is shorter than k")
    if num_tokens == 0:
        return
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    block_d = next_power_of_2(head_dim)
    # Cap a program's tile at ~4k elements; the head axis goes to the grid beyond that.
    block_h = max(1, min(next_power_of_2(num_heads), 4096 // block_d))
    grid = (num_tokens, cdiv(num_heads, block_h))
    args = (
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3],
    )  # fmt: skip
    constexprs = dict(
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1], BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=4 if block_h * block_d >= 1024 else 1,
    )  # fmt: skip
    launcher.run(grid, args, constexprs)


def store_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Plain-torch `store_kv` (host sync on the mask; for tests and the reference backend)."""
    num_tokens = k.shape[0]
    slots = slot_mapping[:num_tokens].to(torch.int64)
    keep = slots >= 0
    slots = slots[keep]
    block_size = k_cache.shape[1]
    blk, off = slots // block_size, slots % block_size
    k_cache[blk, off] = to_cache_dtype(k[keep], k_cache.dtype)
    v_cache[blk, off] = to_cache_dtype(v[keep], v_cache.dtype)
