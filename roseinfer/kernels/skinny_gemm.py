"""`out (+)= x @ w.T` for a few rows (a decode step), as a Triton kernel that can be launched with
programmatic dependent launch (`kernels/pdl.py`).

At qwen2.5-0.5b's shapes cuBLAS is as fast or a little faster launch for launch (at llama-3.1-8b's the two are
within 5% at 32-64 rows, and this kernel is 0-9% faster at 16), but its kernels do not take part in PDL: in a
chain of cuBLAS GEMMs every launch pays its whole fixed cost. With every kernel of a decode layer ours and
launched with PDL, each launch overlaps its predecessor's tail. qwen2.5-0.5b's layer of GEMMs and SiLU on an
H100, 24 layers in a CUDA graph, us a layer (`scripts/probe_pdl_chain.py`):

    rows | cuBLAS + SiLU | these, no PDL | these, PDL
       8 |  24.9-25.1    |  28.2-28.5    | 24.1-24.4
      64 |  26.8-27.0    |  30.1         | 26.0-26.4
     128 |  29.2-29.3    |  38.7-38.8    | 34.5-35.1   (the tiles stop paying: rows are capped at MAX_ROWS)

A program owns BLOCK_N output columns and one share of K. With several shares (split-K, for GEMMs whose
output is too narrow to fill the GPU) each program writes an fp32 partial and a second launch adds them up.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from roseinfer.kernels._common import (
    cdiv,
    dot_dtype,
    dot_precision,
    max_shared_memory,
    next_power_of_2,
    num_sms,
)
from roseinfer.kernels.direct_launch import DirectLaunch
from roseinfer.kernels.pdl import pdl_kwargs, wait_for_producer

MAX_ROWS = 64
MAX_SPLIT = 8
REDUCE_BLOCK = 1024


@dataclass(frozen=True)
class GemmTile:
    block_n: int
    block_k: int
    split: int
    num_warps: int = 4
    num_stages: int = 3


def skinny_tile(n: int, k: int, sms: int, block_m: int = MAX_ROWS) -> GemmTile:
    """The tile for an [n, k] weight and `block_m` (padded) rows, from H100 sweeps of the engine's kernel
    (`scripts/sweep_skinny_tiles.py`, us a launch):
    - qwen2.5-0.5b: qkv (1152 x 896) 16 columns, one share, 4 stages; gate_up (9728 x 896) 32 columns, one
      share, 3 stages (12% slower at 4); o (896 x 896) one share, 4 stages, 32 columns at 64 rows but 16 at
      8-32 rows (2-7% faster there); down (896 x 4864) 32 columns, 4 shares of 256-deep K steps, 4 stages.
    - llama-3.1-8b at 32-64 rows: qkv (6144 x 4096) 32 columns at 4 stages (8% faster than 3); gate_up
      (28672 x 4096) 64 columns at 3 stages (6% faster than 32); o (4096 x 4096) and down (4096 x 14336) one
      share of 256-deep steps (25-30% and 14-25% faster than four and eight shares: 128 column tiles already
      fill the GPU).
    So: an output wider than K takes no split, and 64 columns where that still makes two waves of programs;
    any other cuts K into shares of at least 1024, as many as it takes to give every SM a program. At 64 rows
    short shares of K then take deeper pipelines (`_deep_pipeline`)."""
    tiles = cdiv(n, 32)
    long_k = k >= 2048
    if n > k:
        if tiles < sms // 2:  # narrow: 16-column tiles to fill the GPU
            tile = GemmTile(16, 128, 1, num_stages=4)
        elif cdiv(n, 64) >= 2 * sms:
            tile = GemmTile(64, 128, 1, num_stages=3)
        else:
            tile = GemmTile(32, 128, 1, num_stages=4 if long_k else 3)
    else:
        split = max(1, min(MAX_SPLIT, k // 1024, sms // tiles))
        block_n = 16 if split == 1 and block_m <= 32 and tiles < sms // 2 else 32
        tile = GemmTile(block_n, 256 if k // split >= 1024 else 128, split, num_stages=4)
    return _deep_pipeline(tile, n, k, block_m)


def _deep_pipeline(tile: GemmTile, n: int, k: int, block_m: int) -> GemmTile:
    """At 64 rows, shares of K under 2048 (qwen2.5-0.5b's four GEMMs) take 5-6 stages of shallower K steps.
    The isolated sweep stopped at 4 stages; inside the PDL chain, where each launch's programs are placed while
    the kernel before still runs, these took qwen2.5-0.5b's b=64 step from 1,220 to 1,191 us (H100, each tree
    in its own process; `ab_pdl_decode.py` with tile modifiers, PERFORMANCE.md, twenty-seventh session). At
    16-32 rows they were 0-1.5% slower, and llama-3.1-8b's K is too long for the rule."""
    if block_m < MAX_ROWS or k // tile.split >= 2048:
        return tile
    if n > k:  # qkv and gate_up: 64-deep steps
        return replace(tile, block_k=64, num_stages=6 if tile.block_n == 16 else 5)
    return replace(tile, block_k=128, num_stages=5)  # o and down


def padded_rows(m: int) -> int:
    """The kernel's BLOCK_M for m rows: `tl.dot` needs at least 16."""
    return max(16, next_power_of_2(m))


def fit_shared_memory(tile: GemmTile, block_m: int, elem_bytes: int, limit: int | None) -> GemmTile:
    """`tile` with at most 3 stages, then shallower K steps, then fewer stages, until its pipeline's x and w
    tiles fit `limit` bytes of shared memory (the sweep's tiles are for bf16: fp32 needs twice the room)."""
    stages, block_k = tile.num_stages, tile.block_k

    def need() -> int:
        return stages * (block_m + tile.block_n) * block_k * elem_bytes

    while limit is not None and need() > limit and (stages > 1 or block_k > 32):
        if stages > 3:
            stages -= 1
        elif block_k > 32:
            block_k //= 2
        else:
            stages -= 1
    return replace(tile, block_k=block_k, num_stages=stages)


@functools.cache
def _default_tile(n: int, k: int, block_m: int, elem_bytes: int, device: torch.device) -> GemmTile:
    """The swept tile, fitted to the device: computed once per shape, not on every (eager) launch."""
    return fit_shared_memory(
        skinny_tile(n, k, num_sms(device), block_m), block_m, elem_bytes, max_shared_memory(device)
    )


@triton.jit
def tile_product(
    x_ptr,
    w_ptr,
    stride_x,
    stride_w,
    offs_m,
    offs_n,
    M,
    N,
    K,
    k0,
    k_len,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """fp32 `x[offs_m, k0 : k0 + k_len] @ w[offs_n, k0 : k0 + k_len].T`, in BLOCK_K-deep steps, rows, columns and
    K past the tensors' edges read as 0 (this kernel's K loop, and `logits_sample`'s)."""
    acc = tl.zeros((offs_m.shape[0], offs_n.shape[0]), dtype=tl.float32)
    for kk in range(0, k_len, BLOCK_K):
        offs_k = k0 + kk + tl.arange(0, BLOCK_K)
        xa = tl.load(
            x_ptr + offs_m[:, None] * stride_x + offs_k[None, :],
            mask=(offs_m[:, None] < M) & (offs_k[None, :] < K),
            other=0.0,
        )
        wb = tl.load(
            w_ptr + offs_n[None, :].to(tl.int64) * stride_w + offs_k[:, None],
            mask=(offs_n[None, :] < N) & (offs_k[:, None] < K),
            other=0.0,
        )
        acc = tl.dot(xa.to(DOT_DTYPE), wb.to(DOT_DTYPE), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    part_ptr,
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_o,
    k_per_split,
    ADD: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """Columns [pid_n * BLOCK_N, +BLOCK_N) over K share pid_k: to `out` (plus its old value with ADD) in one
    share, else as the fp32 partial `part[pid_k]`."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    k0 = pid_k * k_per_split
    # Reading the weights before the wait measured slower: programs waiting on the predecessor hold SM slots
    # and bandwidth that it needs (PERFORMANCE.md, seventeenth session).
    wait_for_producer(PDL)
    acc = tile_product(
        x_ptr,
        w_ptr,
        stride_x,
        stride_w,
        offs_m,
        offs_n,
        M,
        N,
        K,
        k0,
        k_per_split,
        BLOCK_K,
        PRECISION,
        DOT_DTYPE,
    )
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT == 1:
        out = out_ptr + offs_m[:, None] * stride_o + offs_n[None, :]
        if ADD:
            acc += tl.load(out, mask=mask, other=0.0).to(tl.float32)
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], acc, mask=mask)


@triton.jit
def _split_sum_kernel(
    part_ptr,
    out_ptr,
    M,
    N,
    stride_o,
    ADD: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    wait_for_producer(PDL)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0)
    out = out_ptr + (offs // N) * stride_o + offs % N
    if ADD:
        acc += tl.load(out, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


launcher = DirectLaunch(_skinny_gemm_kernel)
sum_launcher = DirectLaunch(_split_sum_kernel)


def tile_launch_kwargs(tile: GemmTile, block_m: int, dtype: torch.dtype, pdl: bool) -> dict:
    """A tiled GEMM kernel's launch arguments for `tile` at `block_m` rows: its block constexprs, PDL, the dot's
    precision and input dtype, warps and stages (this kernel's, and `logits_sample`'s)."""
    return {
        "BLOCK_M": block_m,
        "BLOCK_N": tile.block_n,
        "BLOCK_K": tile.block_k,
        **pdl_kwargs(pdl),
        "PRECISION": dot_precision(dtype),
        "DOT_DTYPE": dot_dtype(dtype),
        "num_warps": tile.num_warps,
        "num_stages": tile.num_stages,
    }


def skinny_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor | None = None,
    add: bool = False,
    pdl: bool = False,
    tile: GemmTile | None = None,
) -> torch.Tensor:
    """`x @ w.T` for x [M <= MAX_ROWS, K] and w [N, K], into `out` [M, N] (new if None), or added to `out`
    with `add` (in fp32, rounded once). `pdl`: launch with programmatic dependent launch (sm_90+)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x [M, K] and w [N, K] expected, got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.dtype != w.dtype:
        raise ValueError(f"x is {x.dtype} but w is {w.dtype}")
    if x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError("x and w need a contiguous last dimension")
    m, k = x.shape
    n = w.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"skinny_gemm takes at most {MAX_ROWS} rows, got {m}")
    if out is None:
        if add:
            raise ValueError("add needs an out to add to")
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.stride(-1) != 1 or out.dtype != x.dtype:
        raise ValueError(
            f"out must be {x.dtype} [{m}, {n}] with a contiguous last dim, got {tuple(out.shape)}"
        )
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out if add else out.zero_()
    block_m = padded_rows(m)
    tile = tile or _default_tile(n, k, block_m, x.element_size(), x.device)
    k_per_split = cdiv(cdiv(k, tile.split), tile.block_k) * tile.block_k
    split = cdiv(k, k_per_split)  # shares past K would be empty
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else out
    launcher.run(
        (cdiv(n, tile.block_n), split),
        (x, w, out, part, m, n, k, x.stride(0), w.stride(0), out.stride(0), k_per_split),
        dict(ADD=add, SPLIT=split, **tile_launch_kwargs(tile, block_m, x.dtype, pdl)),
    )
    if split > 1:
        sum_launcher.run(
            (cdiv(m * n, REDUCE_BLOCK),),
            (part, out, m, n, out.stride(0)),
            dict(ADD=add, SPLIT=split, BLOCK=REDUCE_BLOCK, **pdl_kwargs(pdl), num_warps=4),
        )
    return out


def skinny_gemm_ref(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, add: bool = False
) -> torch.Tensor:
    """The product in fp32, plus `out` with `add`, rounded once to x's dtype."""
    acc = x.float() @ w.float().t()
    if add:
        assert out is not None
        acc = acc + out.float()
    return acc.to(x.dtype)
