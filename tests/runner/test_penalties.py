"""Presence, frequency and repetition penalties in the sampler (`runner/penalties.py`), against a plain-Python
reference of vLLM v1's rules: the repetition penalty divides a positive logit (multiplies another) of every id
in the prompt or the row's output so far; then each logit loses frequency_penalty times its id's count in the
output, and presence_penalty where that count is not 0."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from roseinfer.request import Request
from roseinfer.runner.penalties import PenaltyTable
from roseinfer.runner.sampler import SamplingBatch, banned_pairs, sample
from roseinfer.sampling_params import SamplingParams

VOCAB = 64
CPU = torch.device("cpu")
ROWS = 32  # the penalty table's cap (max_num_seqs)


def reference(
    logits: list[float],
    prompt: list[int],
    output: list[int],
    presence: float,
    frequency: float,
    repetition: float,
) -> list[float]:
    """One row penalized by the rules, in plain Python floats."""
    out = list(logits)
    for t in set(prompt) | set(output):
        out[t] = out[t] / repetition if out[t] > 0 else out[t] * repetition
    for t in set(output):
        out[t] -= frequency * output.count(t) + presence
    return out


def request(prompt: list[int], output: list[int], params: SamplingParams, name: str = "r") -> Request:
    """A request as the runner sees it when its next token is launched: its output known, the token being
    sampled counted as pending (`Scheduler._commit`)."""
    req = Request(name, prompt, params)
    for t in output:
        req.append_token(t)
    req.num_pending = 1
    return req


def random_rows(seed: int, n: int) -> tuple[torch.Tensor, list[list[int]], list[list[int]]]:
    rng = np.random.default_rng(seed)
    logits = torch.from_numpy(rng.normal(0.0, 2.0, (n, VOCAB)).astype(np.float32))
    prompts = [rng.integers(0, VOCAB, rng.integers(1, 20)).tolist() for _ in range(n)]
    # small ranges make ids repeat, so that counts above 1 occur
    outputs = [rng.integers(0, VOCAB // 2, rng.integers(1, 30)).tolist() for _ in range(n)]
    return logits, prompts, outputs


PENALTIES = {
    "presence": dict(presence_penalty=1.5),
    "negative_presence": dict(presence_penalty=-2.0),
    "frequency": dict(frequency_penalty=0.7),
    "negative_frequency": dict(frequency_penalty=-1.1),
    "repetition": dict(repetition_penalty=1.8),
    "repetition_below_one": dict(repetition_penalty=0.6),
    "combined": dict(presence_penalty=0.4, frequency_penalty=0.9, repetition_penalty=1.3),
}


@pytest.mark.parametrize("name", sorted(PENALTIES))
def test_penalized_logits_match_the_reference(name):
    """Rows with the penalty and rows without it in one batch: each row as the reference has it."""
    logits, prompts, outputs = random_rows(sorted(PENALTIES).index(name), 8)
    params = [
        SamplingParams(temperature=0.0, **(PENALTIES[name] if i % 3 else {})) for i in range(len(prompts))
    ]
    reqs = [request(p, o, sp, f"r{i}") for i, (p, o, sp) in enumerate(zip(prompts, outputs, params))]
    pen = PenaltyTable(VOCAB, CPU, ROWS).step(reqs, None)
    assert pen is not None
    got = pen.apply(logits.clone())
    for i, (p, o, sp) in enumerate(zip(prompts, outputs, params)):
        want = reference(
            logits[i].tolist(), p, o, sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty
        )
        np.testing.assert_allclose(got[i].numpy(), np.array(want, np.float32), rtol=1e-6, atol=1e-6)
    changed = (got != logits).any(dim=1)
    assert changed.tolist() == [bool(i % 3) for i in range(len(prompts))]  # the test has teeth


def test_greedy_and_seeded_rows_in_one_batch_sample_the_penalized_logits():
    """Greedy rows take the argmax of their penalized logits; a seeded row draws what its seed draws from
    them (the same sampler on the reference's logits, with its own generator seeded alike); rows with no
    penalty are untouched; min_tokens' banned ids stay banned."""
    logits, prompts, outputs = random_rows(3, 6)
    # the penalized ids are the likeliest ones: penalties change the greedy choice
    for i, o in enumerate(outputs):
        logits[i, o] += 6.0
    kinds = [
        dict(temperature=0.0, repetition_penalty=3.0),
        dict(temperature=0.9, seed=17, frequency_penalty=1.5, presence_penalty=0.5),
        dict(temperature=0.0),
        dict(temperature=0.0, presence_penalty=2.0, frequency_penalty=2.0),
        dict(temperature=1.2, seed=5, top_k=10, repetition_penalty=1.7),
        dict(temperature=0.0, repetition_penalty=2.5, min_tokens=3),
    ]
    params = [SamplingParams(**k) for k in kinds]
    reqs = [request(p, o, sp, f"r{i}") for i, (p, o, sp) in enumerate(zip(prompts, outputs, params))]
    banned_ids = [[] for _ in reqs]
    banned_ids[5] = [int(logits[5].argmax())]

    def gens() -> list[torch.Generator | None]:
        return [torch.Generator().manual_seed(p.seed) if p.seed is not None else None for p in params]

    pen = PenaltyTable(VOCAB, CPU, ROWS).step(reqs, None)
    batch = SamplingBatch.build(params, gens(), VOCAB, CPU)
    assert batch.any_penalties
    got = sample(logits.clone(), batch, banned_pairs(banned_ids, VOCAB, CPU), pen)

    want_logits = torch.tensor(
        [
            reference(
                logits[i].tolist(), p, o, sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty
            )
            for i, (p, o, sp) in enumerate(zip(prompts, outputs, params))
        ],
        dtype=torch.float32,
    )
    want_logits[5, banned_ids[5]] = float("-inf")
    plain = [SamplingParams(**{k: v for k, v in kind.items() if "penalty" not in k}) for kind in kinds]
    want = sample(want_logits.clone(), SamplingBatch.build(plain, gens(), VOCAB, CPU))
    assert got.tolist() == want.tolist()
    greedy = [i for i, p in enumerate(params) if p.greedy]
    assert got[greedy].tolist() == want_logits[greedy].argmax(dim=1).tolist()
    unpenalized = sample(logits.clone(), SamplingBatch.build(params, gens(), VOCAB, CPU))
    assert got[[0, 3]].tolist() != unpenalized[[0, 3]].tolist()  # the penalties changed greedy choices


def test_fold_counts_each_request_once_and_a_fork_row_not_at_all():
    """The step's tokens are counted in their requests' rows on the device; the n rows of an n > 1 prompt
    count only the first (the forks' rows start from their own outputs)."""
    sp = SamplingParams(temperature=1.0, frequency_penalty=1.0)
    a, b = request([1, 2], [5, 5, 6], sp, "a"), request([3], [], replace(sp, n=3), "b")
    table = PenaltyTable(VOCAB, CPU, ROWS)
    pen = table.step([a, b, b, b], None)
    assert pen is not None
    pen.fold(torch.tensor([5, 9, 10, 11], dtype=torch.int32))
    counts = table.counts[[table.slot_of[a.uid], table.slot_of[b.uid]]]
    assert counts[0].tolist() == np.bincount([5, 5, 6, 5], minlength=VOCAB).tolist()
    assert counts[1].tolist() == np.bincount([9], minlength=VOCAB).tolist()
    assert table.in_prompt[table.slot_of[b.uid]].nonzero().flatten().tolist() == [3]


def test_a_token_in_flight_counts_when_a_row_is_filled():
    """A request new to the table with an earlier token still in flight (async scheduling): that token is
    read from the previous step's sampled tokens, at the request's pending row."""
    sp = SamplingParams(temperature=0.0, frequency_penalty=1.0)
    req = request([1], [4, 7], sp)
    req.num_pending, req.pending_row = 2, 2  # the token of this step and one of the step before
    previous = torch.tensor([30, 31, 7, 33], dtype=torch.int32)
    table = PenaltyTable(VOCAB, CPU, ROWS)
    table.step([req], previous)
    assert table.counts[table.slot_of[req.uid]].tolist() == np.bincount([4, 7, 7], minlength=VOCAB).tolist()
    other = request([1], [4], sp, "other")
    other.num_pending = 2
    with pytest.raises(RuntimeError, match="in flight"):
        PenaltyTable(VOCAB, CPU, ROWS).step([other], None)


def test_a_released_row_is_reused_clean_and_the_table_grows():
    sp = SamplingParams(temperature=0.0, presence_penalty=1.0)
    table = PenaltyTable(VOCAB, CPU, ROWS)
    first = [request([i], [i + 1] * 3, sp, f"a{i}") for i in range(8)]
    table.step(first, None)
    assert len(table.counts) == 8
    table.release(first[2].uid)
    later = request([40], [41], sp, "b")
    table.step([later], None)
    slot = table.slot_of[later.uid]
    assert slot == 2 and table.counts[slot].nonzero().flatten().tolist() == [41]
    assert table.in_prompt[slot].nonzero().flatten().tolist() == [40]
    more = [request([50], [51], sp, f"c{i}") for i in range(3)]
    table.step(more, None)
    assert len(table.counts) >= 11 and len(set(table.slot_of.values())) == len(table.slot_of) == 11
    assert table.counts[table.slot_of[first[7].uid]].nonzero().flatten().tolist() == [8]  # kept in growing


def test_no_penalty_row_no_table_work():
    table = PenaltyTable(VOCAB, CPU, ROWS)
    reqs = [request([1, 2], [3], SamplingParams(temperature=0.0), "r")]
    assert table.step(reqs, None) is None and not table.slot_of
    assert not SamplingBatch.build([r.params for r in reqs], [None], VOCAB, CPU).any_penalties


def test_the_table_grows_up_to_max_rows_and_no_further():
    """Growth by doubling stops at max_rows (12, not the next doubling, 16); a request past max_rows live ones is
    an error, not a bigger table; a released row makes room."""
    sp = SamplingParams(temperature=0.0, presence_penalty=1.0)
    table = PenaltyTable(VOCAB, CPU, 12)
    first = [request([i], [i + 1], sp, f"a{i}") for i in range(8)]
    table.step(first, None)
    assert len(table.counts) == len(table.in_prompt) == 8
    more = [request([i], [i + 2], sp, f"b{i}") for i in range(4)]
    table.step(more, None)
    assert len(table.counts) == len(table.in_prompt) == 12 and len(table.slot_of) == 12
    assert table.counts[table.slot_of[first[3].uid]].nonzero().flatten().tolist() == [4]  # kept in growing
    late = request([1], [2], sp, "late")
    with pytest.raises(RuntimeError, match=r"at most 12 \(max_num_seqs\)"):
        table.step([late], None)
    table.release(more[0].uid)
    table.step([late], None)
    assert len(table.counts) == 12 and table.counts[table.slot_of[late.uid]].nonzero().flatten().tolist() == [
        2
    ]


def test_a_small_cap_is_the_first_size():
    table = PenaltyTable(VOCAB, CPU, 3)
    table.step([request([1], [2], SamplingParams(temperature=0.0, frequency_penalty=1.0))], None)
    assert len(table.counts) == 3  # not the usual first 8 rows
