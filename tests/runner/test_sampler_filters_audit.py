"""Gaps the mutation audit of runner/sampler.py and logprobs.py found: each test compares against a plain-Python
reference of the documented semantics (vLLM's: top-k first, then top-p on the distribution top-k leaves)."""

from __future__ import annotations

import math

import torch

from roseinfer.logprobs import TokenLogprobs, position_logprobs
from roseinfer.runner.sampler import SamplingBatch, apply_top_k_top_p, sample
from roseinfer.sampling_params import SamplingParams


def kept_by_reference(probs: list[float], top_k: int, top_p: float) -> set[int]:
    """The tokens top-k then top-p keep: top-k by probability, renormalised, then the smallest most-likely-first
    prefix whose mass reaches top_p (the top token always stays)."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])[:top_k]
    total = sum(probs[i] for i in order)
    kept, mass = set(), 0.0
    for i in order:
        if kept and mass >= top_p:
            break
        kept.add(i)
        mass += probs[i] / total
    return kept


def test_top_p_measures_the_mass_that_top_k_leaves():
    # top-k=2 leaves 0.4 and 0.35, renormalised 0.533 and 0.467: a top_p of 0.5 is reached by the first alone
    # (measured on the whole distribution it would not be: 0.4 < 0.5).
    probs = [0.4, 0.35, 0.25]
    masked = apply_top_k_top_p(torch.tensor([probs]).log(), torch.tensor([2]), torch.tensor([0.5]))
    kept = {i for i in range(3) if math.isfinite(masked[0, i].item())}
    assert kept == kept_by_reference(probs, 2, 0.5) == {0}


def test_a_tiny_top_p_keeps_the_most_likely_token():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 30, generator=g)
    for top_p in (1e-6, 1e-9):
        masked = apply_top_k_top_p(logits, None, torch.full((4,), top_p))
        finite = torch.isfinite(masked)
        assert finite.sum(dim=-1).tolist() == [1, 1, 1, 1]
        assert torch.equal(masked.argmax(dim=-1), logits.argmax(dim=-1))


def test_a_sampled_token_in_the_top_k_takes_its_top_k_rank():
    # Token 5 was sampled; it ties token 9, so "tokens at least as likely" counts it second (rank 2), while the
    # top-k lists it first. As vLLM's dict: the sampled token first, with the rank of its top-k place.
    raw = TokenLogprobs(token_ids=[5, 5, 9, 3], logprobs=[-0.7, -0.7, -0.7, -2.0], rank=2)
    entry = position_logprobs(raw, 3, None)
    assert list(entry) == [5, 9, 3]
    assert [lp.rank for lp in entry.values()] == [1, 2, 3]
    assert [lp.logprob for lp in entry.values()] == [-0.7, -0.7, -2.0]


def test_min_p_keeps_tokens_exactly_at_its_floor():
    """Min-p drops the tokens *less* likely than min_p times the most likely one: min_p=1 keeps the most likely
    token (sampling turns greedy), and a token exactly at the floor stays."""
    logits = torch.randn(64, 20, generator=torch.Generator().manual_seed(1))
    batch = SamplingBatch.build(
        [SamplingParams(temperature=1.0, min_p=1.0)] * 64, [None] * 64, 20, torch.device("cpu")
    )
    assert torch.equal(sample(logits.clone(), batch), logits.argmax(dim=-1))
    probs = torch.tensor([[0.5, 0.25, 0.25]])  # floor of min_p=0.5: 0.25, which both others reach
    n = 3000
    rows = probs.log().expand(n, -1).clone()
    batch = SamplingBatch.build(
        [SamplingParams(temperature=1.0, min_p=0.5)] * n, [None] * n, 3, torch.device("cpu")
    )
    batch.shared_generator = torch.Generator().manual_seed(2)
    assert set(sample(rows, batch).tolist()) == {0, 1, 2}


def test_min_p_measures_the_tempered_distribution():
    """vLLM's order: temperature first, then min-p. At temperature 2, [0.6, 0.3, 0.1] becomes about
    [0.47, 0.33, 0.19]: a min_p of 0.3 (floor 0.14) keeps the third token, which the untempered floor (0.18)
    would drop."""
    probs = [0.6, 0.3, 0.1]
    tempered = [p**0.5 for p in probs]
    tempered = [p / sum(tempered) for p in tempered]
    kept = {i for i, p in enumerate(tempered) if p >= 0.3 * max(tempered)}
    assert kept == {0, 1, 2}
    n = 4000
    rows = torch.tensor([probs]).log().expand(n, -1).clone()
    batch = SamplingBatch.build(
        [SamplingParams(temperature=2.0, min_p=0.3)] * n, [None] * n, 3, torch.device("cpu")
    )
    batch.shared_generator = torch.Generator().manual_seed(3)
    assert set(sample(rows, batch).tolist()) == kept
