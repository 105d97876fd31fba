"""sample_tokens (Gumbel-max in two launches) against its torch reference on the same noise."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from roseinfer.kernels._common import is_interpret
from roseinfer.kernels.sampling import exponential, gumbel_noise, sample_tokens, sample_tokens_ref
from tests.kernels.kernel_utils import DEVICE, DTYPE_IDS, generator, randn


def seeds_for(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2**31 - 1, (n,), generator=gen).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(("rows", "vocab"), [(1, 7), (3, 256), (5, 1000), (2, 1537)])
def test_matches_reference_on_the_same_noise(dtype, rows, vocab):
    gen = generator("sample", dtype, rows, vocab)
    logits = randn((rows, vocab), dtype, gen) * 3
    temperature = torch.rand(rows, generator=gen).to(DEVICE) + 0.2
    temperature[0] = 0.0  # a greedy row among sampled ones
    seeds = seeds_for(rows, gen)
    got = sample_tokens(logits, temperature, seeds)
    want = sample_tokens_ref(logits, temperature, gumbel_noise(seeds, vocab))
    assert torch.equal(got.cpu(), want.cpu())
    assert got.dtype == torch.int64 and int(got.min()) >= 0 and int(got.max()) < vocab


@pytest.mark.parametrize("vocab", [5, 300, 1025])
def test_greedy_takes_the_first_maximum(vocab):
    gen = generator("greedy", vocab)
    logits = randn((4, vocab), torch.float32, gen)
    logits[1, :] = 0.0  # all equal: token 0
    logits[2, vocab - 1] = logits[2, 0] = 100.0  # a tie across chunks: the lower id
    got = sample_tokens(logits, None, None)
    assert torch.equal(got.cpu(), logits.argmax(dim=-1).cpu())
    assert got[1].item() == 0 and got[2].item() == 0
    zero_t = sample_tokens(logits, torch.zeros(4, device=DEVICE), seeds_for(4, gen))
    assert torch.equal(zero_t.cpu(), got.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(("rows", "vocab"), [(2, 7), (4, 300), (3, 1537)])
def test_tokens_masked_to_minus_inf_are_never_drawn(dtype, rows, vocab):
    """min_tokens sets a row's stop ids to -inf before this sampler reads the logits: greedy and sampled rows
    draw what the reference draws and never a masked token, even where a masked token was the favourite and a
    whole chunk of a row is masked."""
    gen = generator("masked", dtype, rows, vocab)
    logits = randn((rows, vocab), dtype, gen) * 3
    banned = logits.float().topk(min(3, vocab - 1), dim=-1).indices
    logits.scatter_(1, banned, float("-inf"))
    logits[-1, : min(vocab - 1, 256)] = float("-inf")  # the first chunk (interpreter block) of a row
    temperature = torch.rand(rows, generator=gen).to(DEVICE) + 0.5
    temperature[0] = 0.0
    seeds = seeds_for(rows, gen)
    got = sample_tokens(logits, temperature, seeds)
    want = sample_tokens_ref(logits, temperature, gumbel_noise(seeds, vocab))
    assert torch.equal(got.cpu(), want.cpu())
    assert torch.isfinite(logits[torch.arange(rows, device=DEVICE), got].float()).all()
    greedy = sample_tokens(logits, None, None)
    assert torch.equal(greedy.cpu(), logits.float().argmax(dim=-1).cpu())


@triton.jit
def _exponential_kernel(u_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    u = tl.load(u_ptr + offs, mask=offs < n, other=0.5)
    tl.store(out_ptr + offs, exponential(u), mask=offs < n)


def test_exponential_is_minus_log_to_the_last_digits_near_one():
    """-ln(u) where it is small (u within 2^-8 of 1: the series) to fp32's precision, and elsewhere within the
    fast log2's error on the GPU; u = 0 reads as 1e-20."""
    gen = generator("exponential")
    near_one = 1.0 - torch.arange(1, 4097, dtype=torch.float64) * 2.0**-24  # every u in (1 - 2^-12, 1)
    spread = torch.rand(5000, generator=gen, dtype=torch.float64)
    u = torch.cat([near_one, spread, torch.tensor([0.0, 1e-7, 0.5, 1.0 - 2.0**-8, 1.0 - 2.0**-8 - 2.0**-24])])
    u32 = u.float()
    out = torch.empty_like(u32, device=DEVICE)
    _exponential_kernel[(triton.cdiv(len(u32), 1024),)](u32.to(DEVICE), out, len(u32), BLOCK=1024)
    want = -torch.log(u32.double().clamp(min=1e-20))
    rel = ((out.cpu().double() - want) / want).abs()
    series = (1.0 - u32.double()) < 2.0**-8
    assert rel[series].max() < 2.0**-22
    assert rel[~series].max() < (1e-6 if is_interpret() else 1e-4)


def test_noise_is_gumbel():
    """With the exact match above, the draws follow softmax(logits / T) iff the noise is Gumbel(0, 1)."""
    g = gumbel_noise(torch.tensor([12345, 678], dtype=torch.int64, device=DEVICE), 20000).cpu().double()
    for row in g:
        assert abs(row.mean().item() - 0.5772) < 0.04  # Euler-Mascheroni
        assert abs(row.var().item() - torch.pi**2 / 6) < 0.12
        assert abs((row <= 0).double().mean().item() - 0.3679) < 0.015  # P(G <= 0) = 1/e
    assert (g[0] - g[1]).abs().mean() > 0.5  # other seed, other noise


def test_draws_follow_the_tempered_softmax():
    n, temp = 400, 0.7
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -3.0], device=DEVICE).expand(n, -1).contiguous()
    seeds = torch.arange(n, dtype=torch.int64, device=DEVICE) * 7919 + 11
    got = sample_tokens(logits, torch.full((n,), temp, device=DEVICE), seeds)
    freq = torch.bincount(got.cpu(), minlength=5).float() / n
    want = (logits[0].cpu() / temp).softmax(-1)
    assert (freq - want).abs().max() < 0.07


def test_same_seed_same_draw_other_seed_other_draws():
    gen = generator("seeds")
    logits = torch.zeros((64, 50), device=DEVICE)  # uniform: the draw is all noise
    t = torch.ones(64, device=DEVICE)
    seeds = seeds_for(64, gen)
    a, b = sample_tokens(logits, t, seeds), sample_tokens(logits, t, seeds)
    assert torch.equal(a, b)
    c = sample_tokens(logits, t, seeds + 1)
    assert not torch.equal(a, c) and len(set(a.tolist())) > 10


def test_bad_shapes():
    logits = torch.zeros((2, 10), device=DEVICE)
    with pytest.raises(ValueError, match="temperature and seeds"):
        sample_tokens(logits, torch.ones(2, device=DEVICE), None)
    with pytest.raises(ValueError, match="contiguous"):
        sample_tokens(torch.zeros((10, 2), device=DEVICE).t(), None, None)
    assert sample_tokens(torch.zeros((0, 10), device=DEVICE), None, None).shape == (0,)


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "vocab"), [(64, 151936), (256, 128256), (3, 32000)])
def test_real_sizes_on_the_gpu(rows, vocab):
    gen = generator("sample-gpu", rows, vocab)
    logits = randn((rows, vocab), torch.bfloat16, gen) * 4
    temperature = torch.rand(rows, generator=gen).to(DEVICE) + 0.3
    temperature[::5] = 0.0
    seeds = seeds_for(rows, gen)
    got = sample_tokens(logits, temperature, seeds)
    noise = gumbel_noise(seeds, vocab)
    want = sample_tokens_ref(logits, temperature, noise)
    # The GPU may round x / T differently from torch: a mismatch must be a near tie of the noisy scores.
    t = temperature.unsqueeze(1)
    scores = torch.where(t > 0, logits.float() / t.clamp(min=1e-20) + noise, logits.float())
    rows_off = (got != want).nonzero().flatten()
    gap = (scores[rows_off, got[rows_off]] - scores[rows_off, want[rows_off]]).abs()
    assert len(rows_off) <= max(1, rows // 50) and bool((gap < 1e-3).all())
    greedy = sample_tokens(logits, None, None)
    assert torch.equal(greedy, logits.argmax(dim=-1))
