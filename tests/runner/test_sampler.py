from __future__ import annotations

import pytest
import torch

from roseinfer.runner.sampler import (
    SamplingBatch,
    apply_top_k_top_p,
    banned_pairs,
    compute_logprobs,
    gather_logprobs,
    sample,
    unpack_logprobs,
)
from roseinfer.sampling_params import SamplingParams


def batch_of(params: list[SamplingParams], vocab: int, gens=None) -> SamplingBatch:
    return SamplingBatch.build(params, gens or [None] * len(params), vocab, torch.device("cpu"))


def draw(logits: torch.Tensor, p: SamplingParams, n: int = 4000) -> torch.Tensor:
    rows = logits.expand(n, -1).clone()
    return sample(rows, batch_of([p] * n, logits.shape[-1]))


def test_greedy_is_argmax():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    got = sample(logits, batch_of([SamplingParams(temperature=0.0)] * 5, 50))
    assert torch.equal(got, logits.argmax(-1))


def test_temperature_sampling_follows_softmax():
    torch.manual_seed(1)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    got = draw(logits, SamplingParams(temperature=0.7), 20000)
    freq = torch.bincount(got, minlength=4).float() / got.numel()
    want = (logits[0] / 0.7).softmax(-1)
    assert (freq - want).abs().max() < 0.02


def test_top_k_keeps_only_k_best():
    torch.manual_seed(2)
    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(3))
    got = draw(logits, SamplingParams(temperature=1.0, top_k=3))
    assert set(got.tolist()) <= set(logits[0].topk(3).indices.tolist())
    assert len(set(got.tolist())) == 3


def test_top_p_keeps_the_nucleus():
    torch.manual_seed(4)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    got = draw(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert set(got.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.8: token 2 is outside
    masked = apply_top_k_top_p(logits, None, torch.tensor([0.81]))
    assert torch.isfinite(masked[0, :3]).all() and masked[0, 3] == float("-inf")


def test_min_p_drops_unlikely_tokens():
    torch.manual_seed(5)
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.07, 0.03]]))
    got = draw(logits, SamplingParams(temperature=1.0, min_p=0.1))  # floor 0.06: token 3 dropped
    assert set(got.tolist()) == {0, 1, 2}


def test_mixed_rows_each_get_their_own_settings():
    torch.manual_seed(6)
    logits = torch.randn(3, 30, generator=torch.Generator().manual_seed(7))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=2.0),
    ]
    for _ in range(20):
        got = sample(logits.clone(), batch_of(params, 30))
        assert got[0] == logits[0].argmax() and got[1] == logits[1].argmax()


def test_seeded_generator_reproduces_draws():
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(8))
    p = SamplingParams(temperature=1.0, seed=123)

    def run() -> list[int]:
        gen = torch.Generator().manual_seed(123)
        return [int(sample(logits.clone(), batch_of([p], 100, [gen]))[0]) for _ in range(30)]

    first = run()
    assert first == run()
    assert len(set(first)) > 3


def counts_of(logits: torch.Tensor, p: SamplingParams, n: int, seed: int) -> torch.Tensor:
    """Token counts of n draws from the one row `logits` [1, V], the noise from a generator seeded `seed`."""
    rows = logits.expand(n, -1).clone()
    batch = SamplingBatch.build([p] * n, [None] * n, logits.shape[-1], torch.device("cpu"))
    batch.shared_generator = torch.Generator().manual_seed(seed)
    return torch.bincount(sample(rows, batch), minlength=logits.shape[-1]).double()


def assert_follows(counts: torch.Tensor, want: list[float]) -> None:
    """Counts of n draws against the exact probabilities: no draw of a token of probability 0, and each
    frequency within 6 standard deviations of its probability (a correct sampler fails this with probability
    about 2e-9 a token)."""
    p = torch.tensor(want, dtype=torch.float64)
    n = counts.sum()
    assert counts[p == 0].sum() == 0, f"drew tokens of probability 0: {counts.tolist()}"
    sd = (p * (1 - p) / n).sqrt()
    assert ((counts / n - p).abs() <= 6 * sd).all(), f"frequencies {(counts / n).tolist()} against {want}"


def test_top_k_keeps_every_token_tied_with_the_kth():
    """As vLLM (and HF's top-k warper): top-k keeps every token whose logit is at least the k-th largest, so
    tokens tied at the boundary all stay, each as likely as the others, whatever order the sort left them in."""
    e = torch.e
    logits = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert_follows(counts_of(logits, SamplingParams(top_k=2), 6000, seed=0), [1 / 3, 1 / 3, 1 / 3, 0.0])
    logits = torch.tensor([[0.0, 1.0, 2.0, 1.0, -1.0]])
    z = e**2 + 2 * e
    assert_follows(
        counts_of(logits, SamplingParams(top_k=2), 6000, seed=1), [0.0, e / z, e**2 / z, e / z, 0.0]
    )


def test_top_p_nucleus_is_exact_over_a_large_vocabulary():
    """Over 32k tokens of a peaked row, a running float32 sum from the top reached 1 with about half the
    vocabulary left: a row at top_p = 1 (no top-p, batched with a row that uses it) lost half its tokens, and
    top_p = 0.9999 kept 5829 tokens where the nucleus holds 6124. The kept set must be the float64 nucleus."""
    logits = torch.randn(1, 32000, generator=torch.Generator().manual_seed(2)) * 3
    logits[0, 0] = 20.0
    rows = logits.expand(2, -1).clone()
    masked = apply_top_k_top_p(rows, None, torch.tensor([1.0, 0.9999]))
    assert torch.isfinite(masked[0]).all()  # top_p = 1 keeps every token
    probs = logits[0].double().softmax(-1).sort(descending=True).values
    nucleus = int(((probs.cumsum(0) - probs) < 0.9999).sum())  # tokens with less than top_p before them
    assert abs(int(torch.isfinite(masked[1]).sum()) - nucleus) <= 2


def test_min_p_applies_before_top_p_as_in_vllm():
    """vLLM (v1) filters the tempered distribution by min-p first, then takes the top-p nucleus of what is
    left: here min-p keeps tokens 0 and 1 (2/3 and 1/3 once renormalized) and top_p = 0.6 then keeps token 0
    alone. Top-p first kept both (0.5 is below 0.6), then min-p kept both: token 1 a third of the time."""
    probs = torch.tensor([0.5, 0.25] + [0.005] * 50)
    p = SamplingParams(min_p=0.1, top_p=0.6)
    assert_follows(counts_of(probs.log()[None], p, 2000, seed=3), [1.0] + [0.0] * 51)
    # with top-k the two orders agree: min-p keeps 0 and 1, top-k 2 both of them
    p = SamplingParams(temperature=0.5, min_p=0.1, top_k=2)
    assert_follows(counts_of(probs.log()[None], p, 6000, seed=4), [0.8, 0.2] + [0.0] * 50)


# -- banned tokens (min_tokens) ---------------------------------------------------------------------

BAN_PARAMS = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=0.7),
    "top_k": SamplingParams(temperature=1.0, top_k=3),
    "top_p": SamplingParams(temperature=1.0, top_p=0.5),
    "min_p": SamplingParams(temperature=1.0, min_p=0.5),
}


def bans_for(logits: torch.Tensor, gen: torch.Generator) -> list[list[int]]:
    """Every other row bans its two most likely tokens and a few random ones (some repeated); the rest ban
    nothing."""
    n, vocab = logits.shape
    top2 = logits.topk(min(2, vocab - 1), dim=-1).indices
    bans: list[list[int]] = []
    for row in range(n):
        if row % 2:
            bans.append([])
            continue
        extra = torch.randint(0, vocab, (3,), generator=gen).tolist()
        bans.append(top2[row].tolist() + extra + extra[:1])
    return bans


def masked_copy(logits: torch.Tensor, bans: list[list[int]]) -> torch.Tensor:
    out = logits.clone()
    for row, ids in enumerate(bans):
        for t in ids:
            out[row, t] = float("-inf")
    return out


@pytest.mark.parametrize("kind", sorted(BAN_PARAMS))
@pytest.mark.parametrize(("rows", "vocab"), [(1, 7), (4, 50), (9, 384), (3, 2049)])
def test_banned_tokens_are_never_drawn_and_the_rest_as_if_masked(kind, rows, vocab):
    """`sample` with banned (row, token) pairs draws what it draws from logits with those set to -inf: the
    same tokens for the same noise (greedy rows: the argmax of the rest), never a banned token."""
    gen = torch.Generator().manual_seed(rows * 1000 + vocab)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    bans = bans_for(logits, gen)
    mixed = [BAN_PARAMS[kind] if i % 3 else SamplingParams(temperature=0.0) for i in range(rows)]
    for params in ([BAN_PARAMS[kind]] * rows, mixed):
        for seed in range(3):
            want_batch = batch_of(params, vocab)
            want_batch.shared_generator = torch.Generator().manual_seed(seed)
            want = sample(masked_copy(logits, bans), want_batch)
            batch = batch_of(params, vocab)
            batch.shared_generator = torch.Generator().manual_seed(seed)
            got = sample(logits.clone(), batch, banned_pairs(bans, vocab, logits.device))
            assert torch.equal(got, want)
            for row, ids in enumerate(bans):
                assert int(got[row]) not in ids
    greedy = sample(
        logits.clone(),
        batch_of([BAN_PARAMS["greedy"]] * rows, vocab),
        banned_pairs(bans, vocab, logits.device),
    )
    assert torch.equal(greedy, masked_copy(logits, bans).argmax(-1))


def test_banned_pairs_skip_rows_with_nothing_and_ids_past_the_vocabulary():
    assert banned_pairs([[], []], 10, torch.device("cpu")) is None
    assert banned_pairs([[10, 11]], 10, torch.device("cpu")) is None
    rows, ids = banned_pairs([[], [3, 12, 4], [9]], 10, torch.device("cpu"))
    assert rows.tolist() == [1, 1, 2] and ids.tolist() == [3, 4, 9]


def test_a_banned_token_leaves_the_others_their_odds():
    """A sampled row with its favourite banned draws the others in proportion to their probabilities."""
    probs = torch.tensor([0.6, 0.2, 0.1, 0.1])
    n = 6000
    rows = probs.log().expand(n, -1).clone()
    batch = batch_of([SamplingParams(temperature=1.0)] * n, 4)
    batch.shared_generator = torch.Generator().manual_seed(5)
    got = sample(rows, batch, banned_pairs([[0]] * n, 4, torch.device("cpu")))
    assert_follows(torch.bincount(got, minlength=4).double(), [0.0, 0.5, 0.25, 0.25])


# -- logprobs -------------------------------------------------------------------------------------


def test_logprobs_of_half_precision_logits_are_float32():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    got = compute_logprobs(logits)
    assert got.dtype == torch.float32
    assert torch.equal(got, logits.float().log_softmax(dim=-1))


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_gathered_logprobs_hold_the_sampled_token_then_the_top_k(k):
    """Per row: the sampled token's logprob and rank (the number of tokens at least as likely, so a token
    tied with a better one shares its worse rank, as vLLM counts), then the k best ids and logprobs."""
    logits = torch.tensor(
        [
            [1.0, 3.0, 3.0, 0.5, 2.0, -1.0],  # token 2 tied with token 1 for the top
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # all tied: every token ranks last
            [5.0, 4.0, 3.0, 2.0, 1.0, 0.0],  # the worst token sampled
        ]
    )
    tokens = torch.tensor([2, 3, 5], dtype=torch.int32)
    lp = compute_logprobs(logits)
    packed = gather_logprobs(lp, tokens, k)
    assert packed.dtype == torch.int32
    rows = unpack_logprobs(packed.numpy())
    assert [r.rank for r in rows] == [2, 6, 6]
    for row, r in enumerate(rows):
        assert len(r.token_ids) == len(r.logprobs) == k + 1
        assert r.token_ids[0] == tokens[row] and r.logprobs[0] == float(lp[row, tokens[row]])
        values = lp[row].topk(k).values
        assert r.logprobs[1:] == values.tolist()
        assert lp[row, r.token_ids[1:]].tolist() == values.tolist()
        assert all(isinstance(t, int) for t in r.token_ids) and all(isinstance(v, float) for v in r.logprobs)
    if k >= 2:
        assert set(rows[0].token_ids[1:3]) == {1, 2} and rows[2].token_ids[1:] == list(range(k))
