"""The synthetic workloads of shared/WORKLOADS.md (W1, W2, W4, W5) drawn again here with numpy, straight from
the page's text, and compared token for token with `roseinfer.bench.workloads`: counts, lengths and their
distributions, the token id range `[1000, min(vocab, 32000))`, `numpy.random.default_rng(seed)`, seed 0,
`ignore_eos`, temperature, and the shrinking options (`Limits`, `head`)."""

from __future__ import annotations

import numpy as np
import pytest

from roseinfer.bench.workloads import Limits, Workload, build_workload, token_id_range
from roseinfer.sampling_params import SamplingParams

# vocabularies of the standard shapes (qwen, llama-3.1, gpt2), one under 32000, and toy ones
VOCABS = (151936, 128256, 50257, 32000, 20011, 1001, 384)


def spec_id_range(vocab: int) -> tuple[int, int]:
    """`[1000, min(vocab, 32000))`; a vocabulary of at most 1000 ids (tests' toys) has no such range: all of it."""
    high = min(vocab, 32000)
    return (1000, high) if high > 1000 else (0, high)


def draw(rng: np.random.Generator, lens: list[int], vocab: int) -> list[list[int]]:
    low, high = spec_id_range(vocab)
    return [[int(t) for t in rng.integers(low, high, size=n)] for n in lens]


def check_params(w: Workload, output_lens: list[int], temperature: float) -> None:
    assert len(w.params) == len(output_lens)
    for p, n in zip(w.params, output_lens):
        assert isinstance(p, SamplingParams)
        assert p.max_tokens == n and p.ignore_eos and p.temperature == temperature


@pytest.mark.parametrize("vocab", VOCABS)
def test_the_token_id_range_is_1000_to_the_smaller_of_vocab_and_32000(vocab: int):
    assert token_id_range(vocab) == spec_id_range(vocab)


@pytest.mark.parametrize("vocab", (151936, 20011))
def test_w1_is_64_prompts_of_512_random_tokens_128_greedy_output_tokens(vocab: int):
    w = build_workload("W1", vocab)
    expected = draw(np.random.default_rng(0), [512] * 64, vocab)
    assert w.prompts == expected
    check_params(w, [128] * 64, 0.0)
    assert (w.id, w.seed, w.scaled, w.engine_overrides) == ("W1", 0, False, {})
    ids = np.array(w.prompts)
    assert ids.min() >= 1000 and ids.max() < min(vocab, 32000)


def test_w2_is_256_requests_with_uniform_lengths_from_100_to_1024_at_temperature_0_6():
    """Draw order (workloads.py's docstring): prompt lengths, then output lengths, then the ids."""
    seed = int(np.random.default_rng().integers(0, 2**31))
    for s in (0, seed):
        w = build_workload("W2", 151936, seed=s)
        rng = np.random.default_rng(s)
        prompt_lens = [int(x) for x in rng.integers(100, 1024 + 1, size=256)]  # U[100,1024], both ends in
        output_lens = [int(x) for x in rng.integers(100, 1024 + 1, size=256)]
        assert w.prompt_lens == prompt_lens
        assert w.prompts == draw(rng, prompt_lens, 151936)
        check_params(w, output_lens, 0.6)
        assert w.seed == s and not w.scaled


def test_w2_lengths_reach_both_ends_of_the_range():
    """U[100, 1024] includes 1024 and 100: over many seeds both ends come up, and nothing outside."""
    lens = np.concatenate([build_workload("W2", 1001, seed=s).prompt_lens for s in range(12)])
    outs = np.concatenate([build_workload("W2", 1001, seed=s).output_lens for s in range(12)])
    for x in (lens, outs):
        assert x.min() == 100 and x.max() == 1024


@pytest.mark.parametrize(
    ("wid", "n", "plen", "olen", "overrides"),
    [("W4", 64, 856, 16, {}), ("W5", 512, 65, 2, {"block_size": 64, "max_num_seqs": 16})],
)
def test_the_identical_prompt_workloads(wid: str, n: int, plen: int, olen: int, overrides: dict[str, int]):
    w = build_workload(wid, 151936)
    (prompt,) = draw(np.random.default_rng(0), [plen], 151936)
    assert w.prompts == [prompt] * n
    assert all(p is not w.prompts[0] for p in w.prompts[1:])  # copies: an engine may not share them
    check_params(w, [olen] * n, 0.0)
    assert (w.id, w.seed, w.scaled, w.engine_overrides) == (wid, 0, False, overrides)
    if wid == "W5":  # one shared, partly filled last block
        assert 0 < plen % overrides["block_size"] < overrides["block_size"]
    other = build_workload(wid, 151936, seed=3)
    assert other.prompts[0] == draw(np.random.default_rng(3), [plen], 151936)[0]


def test_the_workload_seed_is_the_default_rng_seed():
    seed = int(np.random.default_rng().integers(1, 2**31))
    w = build_workload("W1", 151936, seed=seed)
    assert w.seed == seed and w.prompts == draw(np.random.default_rng(seed), [512] * 64, 151936)


def test_shrinking_is_flagged_and_caps_every_length():
    rng = np.random.default_rng()
    n, p, o = (int(x) for x in rng.integers(1, 40, size=3))
    for wid in ("W1", "W4", "W5"):
        w = build_workload(wid, 32000, num_requests=n, max_prompt_len=p, max_output_len=o)
        std = build_workload(wid, 32000)
        assert w.scaled and w.num_requests == min(n, std.num_requests)
        assert set(w.prompt_lens) == {min(p, std.prompt_lens[0])}
        assert set(w.output_lens) == {min(o, std.output_lens[0])}
        # a cap above the standard value leaves it alone
        big = build_workload(wid, 32000, num_requests=10**6, max_prompt_len=10**6, max_output_len=10**6)
        assert (big.num_requests, big.prompt_lens, big.output_lens) == (
            std.num_requests,
            std.prompt_lens,
            std.output_lens,
        )
        assert big.prompts == std.prompts
    # W2 under a cap: U[low, high] scaled in proportion, the cap as the new high end
    w2 = build_workload("W2", 32000, num_requests=n, max_prompt_len=512, max_output_len=256)
    rng2 = np.random.default_rng(0)
    assert w2.prompt_lens == [int(x) for x in rng2.integers(50, 512 + 1, size=n)]
    assert w2.output_lens == [int(x) for x in rng2.integers(25, 256 + 1, size=n)]
    assert w2.scaled and "U[50,512]" in w2.description and "U[25,256]" in w2.description
    with pytest.raises(ValueError, match="num_requests must be >= 1"):
        Limits(num_requests=0)
    assert not Limits().any and all(
        Limits(**{k: 1}).any for k in ("num_requests", "max_prompt_len", "max_output_len")
    )


def test_head_is_the_first_requests_and_flagged_scaled():
    w = build_workload("W2", 32000, seed=5)
    k = int(np.random.default_rng().integers(1, 255))
    h = w.head(k)
    assert h.prompts == w.prompts[:k] and h.params == w.params[:k]
    assert h.scaled and h.seed == 5 and h.id == "W2"
    w5 = build_workload("W5", 32000)
    assert w5.head(3).engine_overrides == w5.engine_overrides


def test_workload_totals_and_summary():
    w = build_workload("W2", 32000, num_requests=7, seed=2)
    rng = np.random.default_rng(2)
    plens = rng.integers(100, 1025, size=7)
    olens = rng.integers(100, 1025, size=7)
    assert w.num_prompt_tokens == int(plens.sum()) and w.num_output_tokens == int(olens.sum())
    assert w.max_len == int((plens + olens).max())
    s = w.summary()
    assert (s["num_requests"], s["prompt_tokens"], s["output_tokens"]) == (7, plens.sum(), olens.sum())
    assert (s["seed"], s["scaled"], s["id"]) == (2, True, "W2")
