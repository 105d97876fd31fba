"""A decode step's lm_head and sampler in two launches: `logits = h @ w.T` for a few rows, each column tile
reducing its rows' scores to (best, index) in the epilogue, then one program a row picking its token.

The draw is `sampling.sample_tokens`'s, term for term: row r takes `argmax(logits[r] / T[r] + G)` with the
Gumbel noise G keyed by the row's seed and the token id, or the plain argmax where T[r] = 0, and ties go to
the lowest token id. The scores are taken from the logits as stored (rounded to their dtype), so the tokens
equal `sample_tokens(logits, T, seeds)` bit for bit. Against the cuBLAS lm_head followed by `sample_tokens`,
this saves the sampler's second read of the logits and its launch, and both launches join the decode step's
PDL chain (`kernels/pdl.py`).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton
import triton.language as tl

from roseinfer.kernels._common import cdiv, is_interpret, max_shared_memory, next_power_of_2
from roseinfer.kernels.direct_launch import DirectLaunch
from roseinfer.kernels.pdl import pdl_kwargs, wait_for_producer
from roseinfer.kernels.sampling import gumbel_block
from roseinfer.kernels.skinny_gemm import (
    MAX_ROWS,
    GemmTile,
    fit_shared_memory,
    padded_rows,
    tile_launch_kwargs,
    tile_product,
)

# Steps of more rows run the lm_head on cuBLAS, then the sampler, which is faster there: at 80 / 128 rows by
# 12 / 6 us a greedy qwen2.5-0.5b step and 27 / 12 us at T = 0.6, llama-3.1-8b's by 19 us at 128 rows (H100,
# `scripts/ab_decode_tail.py`; with 128 rows a program, the best tile of `scripts/probe_logits_sample.py`).
# At 256 rows cuBLAS computes the product faster still (qwen2.5-0.5b 174 us with the greedy sampler against 209).
MAX_FUSED_ROWS = MAX_ROWS


def default_tile(rows: int) -> GemmTile:
    """The tile for `rows` rows, from H100 sweeps at qwen2.5-0.5b's and qwen3-0.6b's lm_heads, greedy and at
    T = 0.6 (`scripts/probe_logits_sample.py`): up to 32 rows, 128-deep K steps at 5 stages; past 32 rows,
    64-deep steps at 3 stages (at 64 rows, 131 us a sampled step against 146-163 for the 128-deep tiles, and
    within 1% of the best greedy tile)."""
    if padded_rows(rows) <= 32:
        return GemmTile(64, 128, 1, num_warps=4, num_stages=5)
    return GemmTile(64, 64, 1, num_warps=4, num_stages=3)


@triton.jit
def _logits_sample_kernel(
    h_ptr,
    w_ptr,
    logits_ptr,
    temp_ptr,
    seed_ptr,
    best_ptr,
    index_ptr,
    M,
    N,
    K,
    stride_h,
    stride_w,
    stride_o,
    num_tiles,
    GREEDY_ONLY: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    # Row blocks vary fastest, so that the programs sharing a weight tile run side by side (its re-reads hit L2).
    pid_m = tl.program_id(0)
    pid = tl.program_id(1)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = offs_m < M
    cols = offs_n < N
    wait_for_producer(PDL)
    acc = tile_product(
        h_ptr, w_ptr, stride_h, stride_w, offs_m, offs_n, M, N, K, 0, K, BLOCK_K, PRECISION, DOT_DTYPE
    )
    logits = acc.to(logits_ptr.dtype.element_ty)
    tl.store(
        logits_ptr + offs_m[:, None].to(tl.int64) * stride_o + offs_n[None, :],
        logits,
        mask=rows[:, None] & cols[None, :],
    )
    score = logits.to(tl.float32)
    if not GREEDY_ONLY:
        t = tl.load(temp_ptr + offs_m, mask=rows, other=0.0)
        if tl.max(t, axis=0) > 0.0:  # some row of the tile samples
            seed = tl.load(seed_ptr + offs_m, mask=rows, other=0)
            sampled = t[:, None] > 0.0
            noise = gumbel_block(seed[:, None], pid * BLOCK_N, BLOCK_M, BLOCK_N)
            noisy = score / tl.where(sampled, t[:, None], 1.0) + noise
            score = tl.where(sampled, noisy, score)
    score = tl.where(cols[None, :], score, float("-inf"))
    best = tl.max(score, axis=1)
    index = tl.argmax(score, axis=1)  # the first of equal maxima
    tl.store(best_ptr + offs_m * num_tiles + pid, best, mask=rows)
    tl.store(index_ptr + offs_m * num_tiles + pid, pid * BLOCK_N + index, mask=rows)


@triton.jit
def _pick_kernel(best_ptr, index_ptr, out_ptr, num_tiles, TILES: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, TILES)
    m = c < num_tiles
    wait_for_producer(PDL)
    best = tl.load(best_ptr + row * num_tiles + c, mask=m, other=float("-inf"))
    index = tl.load(index_ptr + row * num_tiles + c, mask=m, other=2**31 - 1)
    top = tl.max(best, axis=0)
    token = tl.min(tl.where(best == top, index, 2**31 - 1), axis=0)
    tl.store(out_ptr + row, token.to(out_ptr.dtype.element_ty))


launcher = DirectLaunch(_logits_sample_kernel)
pick_launcher = DirectLaunch(_pick_kernel)


@functools.cache
def _fitted_tile(tile: GemmTile, block_m: int, elem_bytes: int, limit: int | None) -> GemmTile:
    return fit_shared_memory(tile, block_m, elem_bytes, limit)


def logits_and_sample(
    h: torch.Tensor,  # [M, K], the final norm's output
    w: torch.Tensor,  # [V, K], the lm_head
    temperature: torch.Tensor | None,  # [M] float32, 0 = greedy; None = every row greedy
    seeds: torch.Tensor | None,  # [M] int64 Philox seeds (rows with temperature > 0 read theirs)
    tokens: torch.Tensor,  # [M] int32 or int64: each row's token is written here
    pdl: bool = False,
    tile: GemmTile | None = None,  # block_n, block_k, warps and stages (split is 1)
    row_block: int = MAX_ROWS,  # rows a program takes: more rows take more programs a column tile
) -> torch.Tensor:
    """Every row's logits [M, V] (h's dtype), with each row's token drawn into `tokens`, with no host sync."""
    if h.dim() != 2 or w.dim() != 2 or h.shape[1] != w.shape[1]:
        raise ValueError(f"h [M, K] and w [V, K] expected, got {tuple(h.shape)} and {tuple(w.shape)}")
    if h.dtype != w.dtype or h.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError("h and w need one dtype and a contiguous last dimension")
    m, k = h.shape
    n = w.shape[0]
    if tokens.shape != (m,) or tokens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"tokens must be int32 or int64 [{m}], got {tokens.dtype} {tuple(tokens.shape)}")
    greedy_only = temperature is None
    if not greedy_only and (seeds is None or temperature.shape != (m,) or seeds.shape != (m,)):
        raise ValueError("temperature and seeds must both be [M]")
    logits = torch.empty((m, n), dtype=h.dtype, device=h.device)
    if m == 0:
        return logits
    block_m = min(padded_rows(m), padded_rows(row_block))
    tile = _fitted_tile(tile or default_tile(m), block_m, h.element_size(), max_shared_memory(h.device))
    if is_interpret():
        tile = replace(tile, block_n=min(tile.block_n, 32), block_k=min(tile.block_k, 32), num_stages=1)
    num_tiles = cdiv(n, tile.block_n)
    best = torch.empty((m, num_tiles), dtype=torch.float32, device=h.device)
    index = torch.empty((m, num_tiles), dtype=torch.int32, device=h.device)
    launcher.run(
        (cdiv(m, block_m), num_tiles),
        (
            h, w, logits,
            best if greedy_only else temperature,  # never read when GREEDY_ONLY
            best if greedy_only else seeds,
            best, index, m, n, k, h.stride(0), w.stride(0), logits.stride(0), num_tiles,
        ),
        dict(GREEDY_ONLY=greedy_only, **tile_launch_kwargs(tile, block_m, h.dtype, pdl)),
    )  # fmt: skip
    pick_launcher.run(
        (m,), (best, index, tokens, num_tiles), dict(TILES=next_power_of_2(num_tiles), **pdl_kwargs(pdl))
    )
    return logits
