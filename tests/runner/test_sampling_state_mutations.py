"""Mutation audit (runner/sampling_state.py, logit_controls.py, and the min_tokens / bad-word / penalty-row
bookkeeping they drive): `SamplingState` driven through many steps as the runner drives it (rows reordered,
cached batches reused, requests admitted, finished, preempted and re-admitted, with and without a token in
flight), each step's controlled logits checked against the plain-Python reference of vLLM v1's rules
(`tests/engine/logit_reference.py`: allowed ids, bad words, min_tokens' stop ids and eos, logit bias,
penalties); and the seeded generators of an n > 1 request's samples, which its forks take over and give back."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from roseinfer.request import Request
from roseinfer.runner.sampler import apply_controls
from roseinfer.runner.sampling_state import SamplingState
from roseinfer.sampling_params import SamplingParams
from tests.engine.logit_reference import control, reference_banned

VOCAB = 16
EOS = 15
CPU = torch.device("cpu")
MAX_ROWS = 6  # max_num_seqs: the most requests running at once, and the penalty table's cap
# Bad words as token sequences (set on the request as the engine would after tokenizing): a one-token word,
# and words whose prefixes the drawn tokens (mostly 1, 2, 3) complete often.
WORDS = ((4,), (1, 5), (2, 3, 6), (3, 3, 7), (1, 2, 8), (2, 5))
FAVOURED = [1, 2, 3]


def random_params(rng: np.random.Generator) -> SamplingParams:
    kw: dict = {}
    if rng.random() < 0.5:
        stop = rng.choice([1, 2, 3, 9, 10], size=int(rng.integers(0, 3)), replace=False)
        kw.update(min_tokens=int(rng.integers(1, 7)), stop_token_ids=[int(t) for t in stop])
    if rng.random() < 0.4:
        kw["allowed_token_ids"] = sorted({int(t) for t in rng.integers(0, VOCAB, 10)} | {1, 2})
    if rng.random() < 0.4:
        kw["logit_bias"] = {int(t): float(rng.normal(0, 3)) for t in rng.integers(0, VOCAB, 3)}
    if rng.random() < 0.5:
        kw["bad_words"] = ["placeholder"]  # its ids come from WORDS, set on the request
    if rng.random() < 0.4:
        kw.update(repetition_penalty=1.5, frequency_penalty=0.3, presence_penalty=0.2)
    if rng.random() < 0.3:
        kw.update(temperature=1.0, seed=int(rng.integers(1 << 30)))
    else:
        kw["temperature"] = 0.0
    return SamplingParams(max_tokens=64, ignore_eos=bool(rng.random() < 0.5), **kw)


@dataclass
class Live:
    req: Request
    words: tuple[tuple[int, ...], ...]
    length: int  # it finishes once it has this many tokens
    output: list[int] = field(default_factory=list)  # every token sampled for it, known or in flight
    in_flight: int | None = None  # the last of them, where the host does not know it yet


def controlled(logits: torch.Tensor, state: SamplingState, reqs: list[Request], last_sampled):
    """The step's logits controlled as the runner does it (`ModelRunner.launch`, `sampler.sample` up to the
    draw): its batch, then its masks where some row has min_tokens or controls, then its penalty rows."""
    batch = state.batch(list(range(len(reqs))), reqs, last_sampled)
    banned = controls = None
    if batch.any_min_tokens or batch.any_logit_controls:
        banned, controls = state.masks(reqs, batch, last_sampled)
    penalties = state.penalties if batch.any_penalties else None
    return batch, apply_controls(logits.clone(), banned, penalties, controls), penalties


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_steps_through_a_requests_life_match_the_reference(seed, async_scheduling):
    """Each step samples a random subset of the running requests in a random order, or the same rows as the
    step before (the cached batch); new requests sometimes share an earlier one's params object (as one
    `generate` call's do). Under async scheduling a request sampled by the step before has that token in
    flight (row `pending_row` of the previous launch's tokens); a preempted request comes back once the host
    knows all its tokens. Every row's controlled logits equal the reference's for its whole output, and the
    penalty table and the generators hold only what running requests own."""
    rng = np.random.default_rng(seed)
    state = SamplingState(VOCAB, CPU, 0, MAX_ROWS)
    running: list[Live] = []
    paused: list[Live] = []
    previous: list[Live] = []  # the rows of the last launch
    last_sampled = None
    last_batch = None
    last_uids: list[int] = []
    params_seen: list[SamplingParams] = []
    made = 0
    seen = dict(cached=0, in_flight=0, min_tokens=0, word_bans=0, preempted=0, finished=0, refilled=0)
    for step in range(70):
        # Admissions: fresh requests, and preempted ones whose tokens the host all knows.
        for live in list(paused):
            if live.in_flight is None and rng.random() < 0.5 and len(running) < MAX_ROWS:
                paused.remove(live)
                running.append(live)
                seen["refilled"] += 1
        while len(running) < MAX_ROWS and rng.random() < 0.5:
            if params_seen and rng.random() < 0.4:
                sp = params_seen[int(rng.integers(len(params_seen)))]
            else:
                sp = random_params(rng)
                params_seen.append(sp)
            prompt = rng.integers(0, VOCAB - 1, int(rng.integers(1, 5))).tolist()
            req = Request(f"r{made}", prompt, sp, (EOS,))
            made += 1
            words = tuple(WORDS[i] for i in rng.choice(len(WORDS), 4, replace=False)) if sp.bad_words else ()
            req.bad_words_token_ids = words
            running.append(Live(req, words, int(rng.integers(3, 14))))
        if not running:
            continue
        # The step's rows: the last launch's rows again where they all still run, else a random subset.
        if previous and all(p in running for p in previous) and rng.random() < 0.4:
            lives = list(previous)
            if rng.random() < 0.3:
                rng.shuffle(lives)  # the same requests in another order: another batch
        else:
            lives = [
                running[i] for i in rng.permutation(len(running))[: int(rng.integers(1, len(running) + 1))]
            ]
        reqs = [live.req for live in lives]
        for live in lives:
            live.req.num_pending = 1 + (live.in_flight is not None)  # its own row counts as pending
            seen["in_flight"] += live.in_flight is not None
        logits = torch.from_numpy(rng.normal(0.0, 2.0, (len(lives), VOCAB)).astype(np.float32))
        batch, got, penalties = controlled(logits, state, reqs, last_sampled)
        if last_batch is not None and [r.uid for r in reqs] != last_uids:
            assert batch is not last_batch, step  # other rows: another batch
        seen["cached"] += batch is last_batch
        last_uids = [r.uid for r in reqs]
        last_batch = batch
        tokens = []
        for k, live in enumerate(lives):
            sp = live.req.params
            want = control(
                logits[k].double().tolist(), live.req.prompt_token_ids, live.output, sp, live.words, [EOS]
            )
            want_t = torch.tensor(want, dtype=torch.float64)
            g = got[k].double()
            assert torch.equal(torch.isneginf(g), torch.isneginf(want_t)), (step, k, g.tolist(), want)
            finite = ~torch.isneginf(want_t)
            torch.testing.assert_close(g[finite], want_t[finite], rtol=1e-5, atol=1e-5)
            seen["min_tokens"] += len(live.output) < sp.min_tokens
            seen["word_bans"] += bool(reference_banned([w for w in live.words if len(w) > 1], live.output))
            # The sampled token: mostly a favoured id where one is allowed, so that the words' prefixes occur.
            ok = [t for t in range(VOCAB) if want[t] > float("-inf")]
            fav = [t for t in FAVOURED if t in ok]
            pick = fav if fav and rng.random() < 0.7 else ok or [1]
            tokens.append(int(rng.choice(pick)))
        for k, live in enumerate(lives):  # the launch records its rows (after the masks were asked for)
            live.req.pending_row = k
        sampled = torch.tensor(tokens, dtype=torch.int32)
        if penalties is not None:
            penalties.fold(sampled)
        last_sampled = sampled
        # The host learns tokens: at once in sync mode; under async scheduling the step before's, now.
        for live in previous:
            if live.in_flight is not None:
                live.req.append_token(live.in_flight)
                live.in_flight = None
        for live, t in zip(lives, tokens):
            live.output.append(t)
            if async_scheduling:
                live.in_flight = t
            else:
                live.req.append_token(t)
        for live in lives:
            live.req.num_pending = int(live.in_flight is not None)
        previous = lives
        # Finished requests (all their tokens known) give back their rows and generators.
        for live in list(running):
            if live.in_flight is None and len(live.output) >= live.length:
                running.remove(live)
                state.release(live.req)
                seen["finished"] += 1
        # Preemption: a few running requests, with or without a penalty row, in one call.
        if running and rng.random() < 0.25:
            out = [running[i] for i in rng.permutation(len(running))[: int(rng.integers(1, 4))]]
            for live in out:
                running.remove(live)
                paused.append(live)
            state.preempted([live.req for live in out])
            seen["preempted"] += len(out)
        table = state.penalty_table
        live_uids = {live.req.uid for live in running}
        if table is not None:
            assert set(table.slot_of) <= live_uids, step  # rows only for running requests
            assert len(set(table.slot_of.values())) == len(table.slot_of)
        # Generators only for requests that have not finished.
        unfinished = live_uids | {live.req.uid for live in paused}
        assert {uid for uid, _ in state.generators} <= unfinished, step
    if not async_scheduling:
        assert seen.pop("in_flight") == 0
    print(seen)
    for name, count in seen.items():
        assert count >= 3, (name, seen)  # each kind of event happened


def fork(parent: Request, index: int) -> Request:
    """Sample `index` of an n > 1 request, as `Scheduler._fork` makes it."""
    child = Request(
        f"{parent.request_id}#{index}", parent.prompt_token_ids, parent.params, parent.eos_token_ids
    )
    child.parent, child.sample_index = parent, index
    return child


@pytest.mark.parametrize("seed", [3, 2**40 + 5])
def test_forks_take_over_their_samples_generators_and_give_them_back(seed):
    """An n = 3 prompt samples three rows from one logits row: sample 0 draws from the stream a request with
    n = 1 and the same seed draws from, samples 1 and 2 from streams of their own. The forks then sample
    rows of their own and draw on from where their sample's stream stood (not from a fresh one), and once
    every sample and the request beside them have finished, no generator is left."""
    sp = SamplingParams(temperature=1.0, seed=seed, n=3, max_tokens=8)
    other = SamplingParams(temperature=1.0, seed=seed * 7 + 100, max_tokens=8)
    state = SamplingState(VOCAB, CPU, 0, MAX_ROWS)
    p, q = Request("p", [1, 2], sp), Request("q", [3], other)
    p.num_pending = q.num_pending = 1
    first = state.batch([0, 0, 0, 1], [p, p, p, q], None).generators
    assert all(g is not None for g in first)
    start = [g.get_state().clone() for g in first]
    alone = Request("alone", [1, 2], SamplingParams(temperature=1.0, seed=seed, max_tokens=8))
    fresh = SamplingState(VOCAB, CPU, 0, MAX_ROWS).generator(alone)
    assert fresh is not None and torch.equal(first[0].get_state(), fresh.get_state())
    draws = [torch.rand(4, generator=g) for g in first]  # the prefill's draws move each stream on
    assert len({tuple(d.tolist()) for d in draws}) == 4
    after = [g.get_state().clone() for g in first]
    children = [fork(p, 1), fork(p, 2)]
    for r in children:
        r.num_pending = 1
    p.append_token(5)
    second = state.batch([0, 1, 2, 3], [p, *children, q], None).generators
    for g, want in zip(second, after):
        assert g is not None and torch.equal(g.get_state(), want)
    for r in (children[1], p, q, children[0]):
        state.release(r)
    assert state.generators == {}
    # A sample's stream is the same whoever makes its generator first: the prefill's row, or its fork.
    late = SamplingState(VOCAB, CPU, 0, MAX_ROWS).generator(fork(p, 2))
    assert late is not None and torch.equal(late.get_state(), start[2])


def test_a_request_replaced_by_another_with_the_same_params_gets_its_own_rows():
    """One `generate` call's requests share a params object: a batch of the next request in the finished
    one's place is a new batch, with the new request's penalty row, min_tokens count and bad-word bans."""
    sp = SamplingParams(
        temperature=0.0,
        frequency_penalty=1.0,
        min_tokens=3,
        stop_token_ids=[9],
        bad_words=["w"],
        max_tokens=9,
    )
    state = SamplingState(VOCAB, CPU, 0, MAX_ROWS)
    words = ((1, 5),)
    a, b = Request("a", [2], sp, (EOS,)), Request("b", [3], sp, (EOS,))
    for r, out in ((a, []), (b, [4, 4, 4, 1])):
        r.bad_words_token_ids = words
        for t in out:
            r.append_token(t)
        r.num_pending = 1
    logits = torch.zeros(1, VOCAB)
    controlled(logits, state, [a], None)
    state.release(a)
    _, got, _ = controlled(logits, state, [b], None)
    want = control(logits[0].double().tolist(), b.prompt_token_ids, b.output_token_ids, sp, words, [EOS])
    assert got[0].tolist() == pytest.approx(want)


@pytest.mark.parametrize("seed", [0, 1])
def test_new_penalty_rows_count_the_token_in_flight_and_fill_the_table(seed):
    """A batch whose requests are new to the penalty table, each with its previous token still in flight (row
    `pending_row` of the previous launch's tokens): their rows count that token, read on the device, and as
    many requests as the table's cap (max_num_seqs) each get a row."""
    rng = np.random.default_rng(seed)
    n = 4
    sp = SamplingParams(temperature=0.0, repetition_penalty=1.7, frequency_penalty=0.6, presence_penalty=0.4)
    state = SamplingState(VOCAB, CPU, 0, n)
    previous = torch.from_numpy(rng.integers(0, VOCAB, n + 2).astype(np.int32))
    reqs, outputs = [], []
    for k, row in enumerate(rng.permutation(n + 2)[:n].tolist()):
        req = Request(f"r{k}", rng.integers(0, VOCAB, 3).tolist(), sp)
        known = rng.integers(0, VOCAB, int(rng.integers(0, 4))).tolist()
        for t in known:
            req.append_token(t)
        req.num_pending, req.pending_row = 2, row
        reqs.append(req)
        outputs.append(known + [int(previous[row])])
    logits = torch.from_numpy(rng.normal(0.0, 2.0, (n, VOCAB)).astype(np.float32))
    _, got, penalties = controlled(logits, state, reqs, previous)
    assert penalties is not None
    for k, (req, output) in enumerate(zip(reqs, outputs)):
        want = control(logits[k].double().tolist(), req.prompt_token_ids, output, sp)
        assert got[k].tolist() == pytest.approx(want, rel=1e-5, abs=1e-5), k
