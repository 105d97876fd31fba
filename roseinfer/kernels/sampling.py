"""Greedy and temperature sampling in one read of the logits (Gumbel-max), in two small launches.

Row r draws `argmax(logits[r] / T[r] + G)` with G ~ Gumbel(0, 1) i.i.d. per token, which samples from
`softmax(logits[r] / T[r])`; a row with T = 0 takes the plain argmax. The Gumbel noise comes from
Philox keyed by the row's seed (`gumbel_block`), so a row's draw depends only on its seed and its logits.
The first launch reduces chunks of each row to (best score, its index), the second picks each row's best
chunk; ties go to the lowest token id, as `torch.argmax`. The torch path in `runner/sampler.py` stays the
reference and serves top-k / top-p / min-p.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from roseinfer.kernels._common import cdiv, is_interpret, next_power_of_2
from roseinfer.kernels.direct_launch import DirectLaunch

BLOCK_V = 4096  # tokens per chunk: each program reads 8 KiB of bf16 logits


# The GPU's approximate log2 (one instruction, `lg2.approx`) where the noise is made; the interpreter has none.
_FAST_LOG2 = tl.constexpr(not is_interpret())


@triton.jit
def _log2(x):
    if _FAST_LOG2:
        y = libdevice.fast_log2f(x)
    else:
        y = tl.log2(x)
    return y


@triton.jit
def exponential(u):
    """-ln(u) ~ Exp(1) for u ~ U[0, 1) (u = 0 read as 1e-20). Near u = 1, where -ln(u) is small and an absolute
    error of the fast log2 (2^-22) would be a large relative one, the series -ln(1 - v) = v + v^2/2 + v^3/3 with
    v = 1 - u (exact there): relative error under 2^-24 either way up to u = 1 - 2^-8, and about 2^-22 / |log2 u|
    below it (the fast log2 is one instruction and a multiply, the precise log about 12 FMAs and fix-ups)."""
    v = 1.0 - u
    series = v * (1.0 + v * (0.5 + v * (1.0 / 3.0)))
    log_u = 0.6931471805599453 * _log2(tl.maximum(u, 1e-20))  # ln 2 * log2
    return tl.where(v < 1.0 / 256.0, series, -log_u)


@triton.jit
def gumbel_block(seed, first_col, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Gumbel(0, 1) noise [BLOCK_M, BLOCK_N] for columns [first_col, +BLOCK_N) (first_col a multiple of 4) of
    rows keyed by `seed` (a scalar or [BLOCK_M, 1]). Column 4j + q takes the q-th of the four words Philox
    gives for counter j: one Philox call serves four columns. G = -ln(E) for E ~ Exp(1), E never below 2^-24
    (u < 1), so -ln E is well within the fast log2's range."""
    j = first_col // 4 + tl.arange(0, BLOCK_N // 4)
    r0, r1, r2, r3 = tl.randint4x(seed, tl.zeros((BLOCK_M, 1), dtype=tl.int32) + j[None, :])
    # [m, j, p, q] is column 4j + 2p + q
    r = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (BLOCK_M, BLOCK_N))
    u = tl.random.uint_to_uniform_float(r)  # [0, 1)
    return -0.6931471805599453 * _log2(exponential(u))  # ln 2


@triton.jit
def _chunk_kernel(
    logits_ptr,
    stride_row,
    temp_ptr,
    seed_ptr,
    vocab,
    best_ptr,
    index_ptr,
    num_chunks,
    GREEDY_ONLY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=mask, other=float("-inf"))
    score = x.to(tl.float32)
    if not GREEDY_ONLY:
        t = tl.load(temp_ptr + row)
        if t > 0.0:
            noise = gumbel_block(tl.load(seed_ptr + row), chunk * BLOCK, 1, BLOCK)
            score = score / t + tl.reshape(noise, (BLOCK,))
    score = tl.where(mask, score, float("-inf"))
    best = tl.max(score, axis=0)
    index = tl.argmax(score, axis=0)  # the first of equal maxima
    tl.store(best_ptr + row * num_chunks + chunk, best)
    tl.store(index_ptr + row * num_chunks + chunk, chunk * BLOCK + index)


@triton.jit
def _pick_kernel(best_ptr, index_ptr, out_ptr, num_chunks, CHUNKS: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS)
    m = c < num_chunks
    best = tl.load(best_ptr + row * num_chunks + c, mask=m, other=float("-inf"))
    index = tl.load(index_ptr + row * num_chunks + c, mask=m, other=2**31 - 1)
    top = tl.max(best, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(best == top, index, 2**31 - 1), axis=0).to(tl.int64))


chunk_launcher = DirectLaunch(_chunk_kernel)
pick_launcher = DirectLaunch(_pick_kernel)


def sample_tokens(
    logits: torch.Tensor,  # [N, V], last dim contiguous
    temperature: torch.Tensor | None,  # [N] float32, 0 = greedy; None = every row greedy
    seeds: torch.Tensor | None,  # [N] int64 Philox seeds (rows with temperature > 0 read theirs)
) -> torch.Tensor:
    """Token ids [N] int64, with no host sync."""
    num_rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        raise ValueError("sample_tokens needs a contiguous last dimension")
    greedy_only = temperature is None
    if not greedy_only and (seeds is None or temperature.shape != (num_rows,) or seeds.shape != (num_rows,)):
        raise ValueError("temperature and seeds must both be [num_rows]")
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    block = min(256 if is_interpret() else BLOCK_V, max(4, next_power_of_2(vocab)))
    num_chunks = cdiv(vocab, block)
    best = torch.empty((num_rows, num_chunks), dtype=torch.float32, device=logits.device)
    index = torch.empty((num_rows, num_chunks), dtype=torch.int32, device=logits.device)
    dummy = best  # never read when GREEDY_ONLY
    chunk_launcher.run(
        (num_rows, num_chunks),
        (
            logits, logits.stride(0), dummy if greedy_only else temperature, dummy if greedy_only else seeds,
            vocab, best, index, num_chunks,
        ),
        dict(GREEDY_ONLY=greedy_only, BLOCK=block, num_warps=8 if block >= 2048 else 4),
    )  # fmt: skip
    pick_launcher.run((num_rows,), (best, index, out, num_chunks), dict(CHUNKS=next_power_of_2(num_chunks)))
    return out


@triton.jit
def _noise_kernel(seed_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    first = tl.program_id(1) * BLOCK
    cols = first + tl.arange(0, BLOCK)
    g = tl.reshape(gumbel_block(tl.load(seed_ptr + row), first, 1, BLOCK), (BLOCK,))
    tl.store(out_ptr + row.to(tl.int64) * vocab + cols, g, mask=cols < vocab)


def gumbel_noise(seeds: torch.Tensor, vocab: int) -> torch.Tensor:
    """The noise `sample_tokens` adds for these seeds, [N, V] float32 (for tests)."""
    out = torch.empty((seeds.shape[0], vocab), dtype=torch.float32, device=seeds.device)
    block = 256
    _noise_kernel[(seeds.shape[0], cdiv(vocab, block))](seeds, out, vocab, BLOCK=block)
    return out


def sample_tokens_ref(
    logits: torch.Tensor, temperature: torch.Tensor | None, gumbel: torch.Tensor
) -> torch.Tensor:
    """The same draw in torch, given the Gumbel noise [N, V] explicitly."""
    scores = logits.float()
    if temperature is None:
        return scores.argmax(dim=-1)
    t = temperature.float().unsqueeze(1)
    noisy = scores / t.clamp(min=1e-20) + gumbel
    return torch.where(t.squeeze(1) > 0, noisy.argmax(dim=-1), scores.argmax(dim=-1))
