"""`SamplingParams.output_kind`, as vLLM v1's `RequestOutputKind`: CUMULATIVE outputs hold everything so far;
DELTA outputs only what is new since the sample's previous output (text, token ids, logprob dicts; prompt
logprobs on each sample's first output only); with n > 1 a streamed output holds one sample, one output per
sample that got a token (as vLLM v1); FINAL_ONLY requests show nothing until they finish, then all samples.
`LLM.generate` runs its requests as FINAL_ONLY.

The reference for DELTA is a CUMULATIVE twin of each request (same prompt, same seeded params) in the same
engine: the deltas so far must add up to what the twin showed at the same number of tokens, held-back text
included, and to the twin's final output exactly."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace
from typing import Any

import pytest

from roseinfer import LLM, CompletionOutput, RequestOutput, RequestOutputKind, SamplingParams
from roseinfer.engine.request_outputs import RequestGroup

CUMULATIVE, DELTA, FINAL_ONLY = (
    RequestOutputKind.CUMULATIVE,
    RequestOutputKind.DELTA,
    RequestOutputKind.FINAL_ONLY,
)
NEVER = "\u2603\u2603\u2603"  # a stop string the tiny model never writes: it only makes text wait


@pytest.fixture(scope="module", params=[True, False], ids=["async", "sync"])
def llm(request: pytest.FixtureRequest, model_with_tokenizer: str) -> LLM:
    return LLM(
        model_with_tokenizer,
        device="cpu",
        block_size=4,
        cpu_kv_tokens=2048,
        max_num_batched_tokens=24,  # long prompts take several steps
        async_scheduling=request.param,
    )


Outputs = dict[str, list[tuple[int, RequestOutput]]]


def run(
    llm: LLM, requests: list[tuple[list[int], SamplingParams]]
) -> tuple[list[str], Outputs, dict[int, set[tuple[str, int]]]]:
    """Adds the requests and steps until idle. Returns their ids, each one's (step, output) pairs in order, and
    for each step the (request id, sample index) pairs the core gave a token (the samples that changed)."""
    engine = llm.engine
    rids = [engine.add_request(prompt, params) for prompt, params in requests]
    outs: Outputs = defaultdict(list)
    changed: dict[int, set[tuple[str, int]]] = {}
    core_step, step_no = engine.core.step, 0

    def spy() -> Any:
        got, finished = core_step()
        changed[step_no] = {((r.parent or r).request_id, r.sample_index) for r in got}
        return got, finished

    engine.core.step = spy  # type: ignore[method-assign]
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                outs[out.request_id].append((step_no, out))
            step_no += 1
    finally:
        del engine.core.step
    return rids, outs, changed


def random_params(rng: random.Random, text: str) -> SamplingParams:
    stops = []
    if text and rng.random() < 0.7:
        start = rng.randrange(len(text))
        stops.append(text[start : start + rng.randint(1, 3)])  # found in the free run: it may stop
    if rng.random() < 0.5:
        stops.append(NEVER)
    max_tokens = rng.randint(1, 14)
    return SamplingParams(
        temperature=rng.choice([0.0, 0.7, 1.0]),
        seed=rng.randrange(1000),
        n=rng.choice([1, 1, 2, 3]),
        max_tokens=max_tokens,
        min_tokens=rng.randint(0, min(2, max_tokens)),
        stop=stops,
        include_stop_str_in_output=rng.random() < 0.3,
        ignore_eos=rng.random() < 0.7,
        logprobs=rng.choice([None, None, 0, 2]),
        prompt_logprobs=rng.choice([None, None, 1]),
    )


def assert_same_logprobs(got: list | None, want: list | None) -> None:
    """Equal but for float noise: the twins' steps batch (and chunk) them differently."""
    assert (got is None) == (want is None)
    for a, b in zip(got or [], want or [], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert [(t, x.rank, x.decoded_token) for t, x in a.items()] == [
                (t, x.rank, x.decoded_token) for t, x in b.items()
            ]
            assert [x.logprob for x in a.values()] == pytest.approx([x.logprob for x in b.values()], abs=1e-4)


def last_per_sample(outs: list[RequestOutput]) -> dict[int, CompletionOutput]:
    """A CUMULATIVE stream: each sample's last output (one sample an output, as vLLM v1's n > 1 streaming)."""
    assert all(len(o.outputs) == 1 for o in outs)
    return {o.outputs[0].index: o.outputs[0] for o in outs}


def by_tokens(outs: list[RequestOutput]) -> dict[tuple[int, int], str]:
    """A CUMULATIVE stream: (sample index, number of tokens) -> the text it showed then."""
    return {(c.index, len(c.token_ids)): c.text for o in outs for c in o.outputs}


@pytest.mark.parametrize("seed", range(5))
def test_deltas_add_up_to_the_cumulative_outputs(llm: LLM, seed: int) -> None:
    rng = random.Random(seed)
    prompts = [[rng.randrange(5, 500) for _ in range(rng.randint(1, 40))] for _ in range(4)]
    free = llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False
    )
    requests = []
    for prompt, out in zip(prompts, free):
        params = random_params(rng, out.outputs[0].text)
        requests += [(prompt, params), (prompt, replace(params, output_kind=DELTA))]
    rids, outs, changed = run(llm, requests)
    compared = 0
    for (_, params), cum_id, delta_id in zip(requests[::2], rids[::2], rids[1::2]):
        cums, deltas = [o for _, o in outs[cum_id]], outs[delta_id]
        final = last_per_sample(cums)
        assert cums[-1].finished and len(final) == params.n
        assert [o.finished for _, o in deltas] == [False] * (len(deltas) - 1) + [True]
        firsts = {o.outputs[0].index: o for _, o in reversed(deltas)}  # each sample's first delta
        for _, o in deltas:
            if o is firsts[o.outputs[0].index]:
                assert_same_logprobs(o.prompt_logprobs, cums[-1].prompt_logprobs)
            else:
                assert o.prompt_logprobs is None
        seen = by_tokens(cums)
        text: dict[int, str] = defaultdict(str)
        ids: dict[int, list[int]] = defaultdict(list)
        logprobs: dict[int, list] = defaultdict(list)
        assert all(len(o.outputs) == 1 for _, o in deltas)
        for step in {step for step, _ in deltas} | {s for s, got in changed.items() if delta_id in dict(got)}:
            indices = sorted(o.outputs[0].index for s, o in deltas if s == step)
            assert indices == sorted({i for rid, i in changed[step] if rid == delta_id}), step
        for _, o in deltas:
            for c in o.outputs:
                assert c.token_ids, c  # a sample shows up only with new tokens
                text[c.index] += c.text
                ids[c.index] += c.token_ids
                logprobs[c.index] += c.logprobs or []
                assert (c.logprobs is None) == (params.logprobs is None)
                if c.finish_reason is None and (c.index, len(ids[c.index])) in seen:
                    # What the twin showed at as many tokens: the text a stop string may still claim is held.
                    assert text[c.index] == seen[c.index, len(ids[c.index])]
                    compared += 1
                if c.finish_reason is not None:
                    want = final[c.index]
                    assert (text[c.index], ids[c.index]) == (want.text, want.token_ids)
                    assert (c.finish_reason, c.stop_reason) == (want.finish_reason, want.stop_reason)
                    assert c.cumulative_logprob == pytest.approx(want.cumulative_logprob, abs=1e-3)
                    assert_same_logprobs(logprobs[c.index], want.logprobs or [])
        assert sorted(text) == sorted(final)  # each sample finished, in some delta
    assert compared > 0


def test_a_delta_holds_back_what_could_begin_a_stop_string(llm: LLM) -> None:
    """While the sample runs, the text the deltas have shown is the whole text less one character fewer than
    the longest stop string; the last delta brings the rest."""
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[NEVER])
    free = llm.generate([[5, 6, 7]], replace(params, stop=[]), use_tqdm=False)[0].outputs[0]
    decode = llm.tokenizer.decode
    _, outs, _ = run(llm, [([5, 6, 7], replace(params, output_kind=DELTA))])
    ((_, deltas),) = outs.items()
    shown, ids = "", []
    for _, o in deltas:
        (c,) = o.outputs
        shown, ids = shown + c.text, ids + c.token_ids
        whole = decode(ids)
        if not o.finished and "\ufffd" not in whole:
            assert shown == whole[: max(len(whole) - (len(NEVER) - 1), 0)]
    assert shown == free.text and ids == free.token_ids


def test_final_only_requests_return_one_output_when_they_finish(llm: LLM) -> None:
    params = SamplingParams(temperature=1.0, seed=7, n=3, max_tokens=8, logprobs=1, prompt_logprobs=1)
    rids, outs, _ = run(
        llm, [([9, 8, 7, 6], params), ([9, 8, 7, 6], replace(params, output_kind=FINAL_ONLY))]
    )
    cums, ((_, only),) = [o for _, o in outs[rids[0]]], outs[rids[1]]
    assert len(cums) > 1 and only.finished
    assert [c.index for c in only.outputs] == [0, 1, 2]
    for got, want in zip(
        only.outputs, sorted(last_per_sample(cums).values(), key=lambda c: c.index), strict=True
    ):
        assert (got.index, got.text, got.token_ids) == (want.index, want.text, want.token_ids)
        assert_same_logprobs(got.logprobs, want.logprobs)
    assert_same_logprobs(only.prompt_logprobs, cums[-1].prompt_logprobs)


def test_step_final_only_makes_a_delta_request_show_everything_at_once(llm: LLM) -> None:
    engine = llm.engine
    want = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)[0]
    rid = engine.add_request([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=6, output_kind=DELTA))
    got = []
    while engine.has_unfinished_requests():
        got += [o for o in engine.step(final_only=True) if o.request_id == rid]
    assert len(got) == 1 and got[0].outputs == want.outputs


def test_generate_runs_its_requests_as_final_only(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """As vLLM's: whatever output_kind the caller asked, generate returns whole final outputs, leaving the
    caller's params as they were, and builds one output a request (none for running requests)."""
    built = []
    output = RequestGroup.output
    monkeypatch.setattr(RequestGroup, "output", lambda self: built.append(self) or output(self))
    kinds = [CUMULATIVE, DELTA, FINAL_ONLY]
    params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, output_kind=k) for k in kinds]
    got = llm.generate([[5, 6, 7]] * 3, params, use_tqdm=False)
    assert len(built) == 3
    assert got[0].outputs == got[1].outputs == got[2].outputs and len(got[0].outputs[0].token_ids) == 6
    assert [p.output_kind for p in params] == kinds


@pytest.mark.parametrize("bad", ["delta", 1, None, "FINAL_ONLY"])
def test_output_kind_must_be_a_request_output_kind(bad: object) -> None:
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind=bad)  # type: ignore[arg-type]
    assert SamplingParams().output_kind is CUMULATIVE
