"""The kernels of `probe_pdl_chain.py`: a skinny Triton GEMM (split-K with a reduce launch), SiLU-and-mul, and
the programmatic-dependent-launch prologue each can run with (`Launch`). Probe code, not the engine's."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from roseinfer.kernels._common import dot_dtype  # also lets the interpreter run loops under numpy >= 2.4

BULK_PREFETCH = tl.constexpr(
    "{ .reg .pred p; setp.gt.u32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }"
)


@triton.jit
def _let_dependents_go(PDL: tl.constexpr, EARLY: tl.constexpr, AT_START: tl.constexpr):
    """Under PDL the next kernel may launch once every program of this one has called this (or exited):
    at the start with EARLY, else once past the wait (`_wait_for_predecessor`)."""
    if PDL:
        if EARLY == AT_START:
            gdc_launch_dependents()


@triton.jit
def _wait_for_predecessor(PDL: tl.constexpr, EARLY: tl.constexpr):
    """Under PDL: block until the previous kernel has finished and its writes are visible."""
    if PDL:
        gdc_wait()
        _let_dependents_go(PDL, EARLY, False)


@triton.jit
def _gemm_kernel(
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
    PRE: tl.constexpr,
    EARLY: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """out (+)= x @ w.T for one BLOCK_N column tile and one K share; with SPLIT > 1 the fp32 partial goes to
    part[pid_k] and `_reduce_kernel` finishes it."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    k0 = pid_k * k_per_split
    _let_dependents_go(PDL, EARLY, True)
    if PRE == 1:
        rows = w_ptr.to(tl.pointer_type(tl.uint8)) + (offs_n.to(tl.int64) * stride_w + k0) * 2
        size = tl.where(offs_n < N, (tl.minimum(k0 + k_per_split, K) - k0) * 2, 0).to(tl.int32)
        tl.inline_asm_elementwise(
            BULK_PREFETCH, "=r,l,r", [rows, size], dtype=tl.int32, is_pure=False, pack=1
        )
    if PRE >= 2:  # the first K step's weights before waiting on the predecessor (2: the only step)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w_tile = tl.load(
            w_ptr + offs_n[None, :].to(tl.int64) * stride_w + offs_k[:, None],
            mask=(offs_n[None, :] < N) & (offs_k[:, None] < K),
            other=0.0,
        )
    _wait_for_predecessor(PDL, EARLY)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PRE >= 2:
        xa = tl.load(
            x_ptr + offs_m[:, None] * stride_x + offs_k[None, :],
            mask=(offs_m[:, None] < M) & (offs_k[None, :] < K),
            other=0.0,
        )
        acc = tl.dot(xa.to(DOT_DTYPE), w_tile.to(DOT_DTYPE), acc)
    if PRE != 2:
        for kk in range(
            BLOCK_K if PRE == 3 else 0, k_per_split, BLOCK_K
        ):  # k_per_split: a multiple of BLOCK_K
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
            acc = tl.dot(xa.to(DOT_DTYPE), wb.to(DOT_DTYPE), acc)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT == 1:
        out = out_ptr + offs_m[:, None] * stride_o + offs_n[None, :]
        if ADD:
            acc += tl.load(out, mask=mask, other=0.0).to(tl.float32)
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], acc, mask=mask)


@triton.jit
def _reduce_kernel(
    part_ptr,
    out_ptr,
    M,
    N,
    stride_o,
    ADD: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
    EARLY: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    _let_dependents_go(PDL, EARLY, True)
    _wait_for_predecessor(PDL, EARLY)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0)
    out = out_ptr + (offs // N) * stride_o + offs % N
    if ADD:
        acc += tl.load(out, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(
    g_ptr, s_ptr, inter, stride_g, stride_s, BLOCK: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    _let_dependents_go(PDL, EARLY, True)
    _wait_for_predecessor(PDL, EARLY)
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(g_ptr + row * stride_g + inter + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(s_ptr + row * stride_s + cols, (g * tl.sigmoid(g) * u).to(s_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class Tile:
    block_n: int
    block_k: int
    split: int
    warps: int = 4
    stages: int = 3


@dataclass(frozen=True)
class Launch:
    pdl: bool = False
    prefetch: bool = False
    preload: bool = False  # needs a tile with one K step a program
    preload_first: bool = False  # the first K step only
    early: bool = False


def _pdl_kwargs(launch: Launch) -> dict[str, bool]:
    return {"launch_pdl": True} if launch.pdl else {}


def gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    part: torch.Tensor,
    tile: Tile,
    launch: Launch,
    add: bool,
) -> None:
    """out (+)= x @ w.T; `part` is an fp32 workspace of at least split * M * N."""
    m, k = x.shape
    n = w.shape[0]
    k_per_split = triton.cdiv(triton.cdiv(k, tile.split), tile.block_k) * tile.block_k
    if launch.preload and k_per_split != tile.block_k:
        raise ValueError(f"preload needs one K step a program: {tile} at K={k}")
    grid = (triton.cdiv(n, tile.block_n), tile.split)
    _gemm_kernel[grid](
        x, w, out, part, m, n, k, x.stride(0), w.stride(0), out.stride(0), k_per_split,
        ADD=add, SPLIT=tile.split, BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, PDL=launch.pdl, PRE=2 if launch.preload else 3 if launch.preload_first else int(launch.prefetch), EARLY=launch.early,
        DOT_DTYPE=dot_dtype(x.dtype),
        num_warps=tile.warps, num_stages=tile.stages, **_pdl_kwargs(launch),
    )  # fmt: skip
    if tile.split > 1:
        block = 1024
        _reduce_kernel[(triton.cdiv(m * n, block),)](
            part, out, m, n, out.stride(0), ADD=add, SPLIT=tile.split, BLOCK=block, PDL=launch.pdl,
            EARLY=launch.early, num_warps=4, **_pdl_kwargs(launch),
        )  # fmt: skip


def silu_mul(gu: torch.Tensor, s: torch.Tensor, launch: Launch) -> None:
    m, inter = s.shape
    block = 1024
    _silu_mul_kernel[(m, triton.cdiv(inter, block))](
        gu, s, inter, gu.stride(0), s.stride(0), BLOCK=block, PDL=launch.pdl, EARLY=launch.early, num_warps=4,
        **_pdl_kwargs(launch),
    )  # fmt: skip
