"""n > 1 requests streamed as vLLM v1 streams them (`ParentRequest.get_outputs`): under CUMULATIVE or DELTA each
step gives one output per sample that got a token, holding that sample alone (its whole text so far, or what
is new for it), under the parent's request id; a sample whose finished output went out gives nothing more;
`finished` only once every sample has finished. FINAL_ONLY (and so `LLM.generate`) gives one output holding
all n samples, built once.

The references: a FINAL_ONLY run of the same seeded params with no stop (the samples' free runs), cut in plain
Python at the first stop token id; and, for the step-by-step shape, the samples the engine core gave a token
in each step."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from roseinfer import LLM, RequestOutput, RequestOutputKind, SamplingParams
from roseinfer.engine.request_outputs import RequestGroup, SequenceOutput
from tests.engine.test_output_kind import run

CUMULATIVE, DELTA, FINAL_ONLY = (
    RequestOutputKind.CUMULATIVE,
    RequestOutputKind.DELTA,
    RequestOutputKind.FINAL_ONLY,
)
PROMPT = [11, 12, 13, 14, 15]


@pytest.fixture(scope="module", params=[True, False], ids=["async", "sync"])
def llm(request: pytest.FixtureRequest, model_with_tokenizer: str) -> LLM:
    return LLM(
        model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=2048, async_scheduling=request.param
    )


def free_runs(llm: LLM, params: SamplingParams, prompt: list[int] = PROMPT) -> list[list[int]]:
    """Each sample's tokens with no stop token ids (FINAL_ONLY, as generate)."""
    (out,) = llm.generate([prompt], replace(params, stop_token_ids=[]), use_tqdm=False)
    return [c.token_ids for c in out.outputs]


def cut_at_stop(tokens: list[int], stops: list[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in stops:
            return tokens[: i + 1]
    return tokens


def staggered_params(llm: LLM, kind: RequestOutputKind, **kw) -> tuple[SamplingParams, list[list[int]]]:
    """Seeded n=3 params whose samples end at different steps (a stop token id taken from sample 0's free
    run), and each sample's expected tokens."""
    params = SamplingParams(
        temperature=1.0, seed=5, n=3, max_tokens=10, ignore_eos=True, output_kind=kind, **kw
    )
    free = free_runs(llm, params)
    stop = free[0][2]  # sample 0 stops at its third token at the latest
    want = [cut_at_stop(f, [stop]) for f in free]
    assert len({len(w) for w in want}) > 1 or len(want[0]) < 10, "the samples should not all run to length"
    return replace(params, stop_token_ids=[stop]), want


def check_shape(
    outs: list[tuple[int, RequestOutput]], changed: dict[int, set[tuple[str, int]]], rid: str, n: int
) -> None:
    """One sample an output; per step, the samples that got a token; finished on the last output only; each
    sample's finished output is its last."""
    assert outs and all(len(o.outputs) == 1 and o.request_id == rid for _, o in outs)
    steps = {s for s, _ in outs} | {s for s, got in changed.items() if any(r == rid for r, _ in got)}
    for step in steps:
        shown = sorted(o.outputs[0].index for s, o in outs if s == step)
        assert shown == sorted(i for r, i in changed[step] if r == rid), step
    assert [o.finished for _, o in outs] == [False] * (len(outs) - 1) + [True]
    per_sample: dict[int, list[RequestOutput]] = defaultdict(list)
    for _, o in outs:
        per_sample[o.outputs[0].index].append(o)
    assert sorted(per_sample) == list(range(n))
    for stream in per_sample.values():
        reasons = [o.outputs[0].finish_reason for o in stream]
        assert reasons[-1] is not None and all(r is None for r in reasons[:-1])


def test_cumulative_outputs_hold_one_sample_each_with_all_its_tokens(llm: LLM) -> None:
    params, want = staggered_params(llm, CUMULATIVE)
    (final,) = llm.generate([PROMPT], params, use_tqdm=False)  # FINAL_ONLY twin: the whole texts
    (rid,), outs, changed = run(llm, [(PROMPT, params)])
    check_shape(outs[rid], changed, rid, 3)
    last: dict[int, list[int]] = {}
    texts: dict[int, str] = {}
    for _, o in outs[rid]:
        c = o.outputs[0]
        before = last.get(c.index, [])
        assert c.token_ids[: len(before)] == before and len(c.token_ids) > len(before)
        last[c.index], texts[c.index] = c.token_ids, c.text
    assert [last[i] for i in range(3)] == want
    assert [texts[i] for i in range(3)] == [c.text for c in final.outputs]


def test_deltas_of_each_sample_add_up_to_its_tokens_and_final_text(llm: LLM) -> None:
    params, want = staggered_params(llm, DELTA)
    (final,) = llm.generate([PROMPT], params, use_tqdm=False)  # FINAL_ONLY twin: the whole texts
    (rid,), outs, changed = run(llm, [(PROMPT, params)])
    check_shape(outs[rid], changed, rid, 3)
    ids: dict[int, list[int]] = defaultdict(list)
    text: dict[int, str] = defaultdict(str)
    for _, o in outs[rid]:
        c = o.outputs[0]
        assert c.token_ids
        ids[c.index] += c.token_ids
        text[c.index] += c.text
    assert [ids[i] for i in range(3)] == want
    assert [text[i] for i in range(3)] == [c.text for c in final.outputs]


@pytest.mark.parametrize("kind", [CUMULATIVE, DELTA])
def test_prompt_logprobs_on_every_output_or_each_sample_s_first_delta(
    llm: LLM, kind: RequestOutputKind
) -> None:
    """As vLLM v1, whose n samples are n requests with a prompt-logprobs processor each: CUMULATIVE repeats them
    on every output, DELTA gives them on each sample's first output."""
    params, _ = staggered_params(llm, kind, prompt_logprobs=1)
    (rid,), outs, _ = run(llm, [(PROMPT, params)])
    seen: set[int] = set()
    for _, o in outs[rid]:
        index = o.outputs[0].index
        first = index not in seen
        seen.add(index)
        if kind is CUMULATIVE or first:
            assert o.prompt_logprobs is not None and len(o.prompt_logprobs) == len(PROMPT)
        else:
            assert o.prompt_logprobs is None


@pytest.mark.parametrize("kind", [CUMULATIVE, DELTA])
def test_n_1_streams_one_output_a_step_as_before(llm: LLM, kind: RequestOutputKind) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, output_kind=kind)
    (rid,), outs, changed = run(llm, [(PROMPT, params)])
    check_shape(outs[rid], changed, rid, 1)
    assert len(outs[rid]) == 6  # one token a step once decoding
    tokens = outs[rid][-1][1].outputs[0].token_ids if kind is CUMULATIVE else None
    if tokens is None:
        tokens = [t for _, o in outs[rid] for t in o.outputs[0].token_ids]
    assert tokens == free_runs(llm, replace(params, output_kind=FINAL_ONLY))[0]


@pytest.mark.parametrize("abort_after", [0, 1, 4])
@pytest.mark.parametrize("kind", [CUMULATIVE, DELTA])
def test_aborting_an_n_3_request_mid_stream(llm: LLM, kind: RequestOutputKind, abort_after: int) -> None:
    """No output for it after the abort, its samples release their blocks (the invariants fixture checks it
    after the abort and every step), and a request beside it runs to its end unchanged."""
    engine = llm.engine
    other = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    want = free_runs(llm, other, [7, 8, 9])[0]
    victim = engine.add_request(
        PROMPT, SamplingParams(temperature=1.0, seed=1, n=3, max_tokens=30, output_kind=kind)
    )
    engine.add_request([7, 8, 9], other)
    seen: list[RequestOutput] = []
    kept: list[RequestOutput] = []
    while len(seen) < abort_after:
        for o in engine.step():
            (seen if o.request_id == victim else kept).append(o)
    assert not any(o.finished for o in seen)
    engine.abort_request(victim)
    assert victim not in engine.groups
    while engine.has_unfinished_requests():
        for o in engine.step():
            assert o.request_id != victim, o
            kept.append(o)
    assert kept[-1].finished and kept[-1].outputs[0].token_ids == want
    assert not engine.groups


def test_final_only_builds_one_output_with_every_sample(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """No per-step output for a FINAL_ONLY group: each sample's CompletionOutput is built once, at the end, and
    no streamed output at all; generate returns one output a prompt holding all n samples in index order."""
    built: list[int] = []
    output = SequenceOutput.output
    monkeypatch.setattr(
        SequenceOutput, "output", lambda self, delta=False: built.append(1) or output(self, delta)
    )
    monkeypatch.setattr(RequestGroup, "sample_output", lambda self, req: pytest.fail("a streamed output"))
    params = SamplingParams(
        temperature=1.0, seed=2, n=3, max_tokens=7, ignore_eos=True, output_kind=FINAL_ONLY
    )
    (rid,), outs, _ = run(llm, [(PROMPT, params)])
    ((_, only),) = outs[rid]
    assert only.finished and [c.index for c in only.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 7 for c in only.outputs)
    assert len(built) == 3
    got = llm.generate([PROMPT, [3, 4]], replace(params, output_kind=CUMULATIVE), use_tqdm=False)
    assert len(got) == 2 and all([c.index for c in o.outputs] == [0, 1, 2] for o in got)
    assert [c.token_ids for c in got[0].outputs] == [c.token_ids for c in only.outputs]  # same seeds


@pytest.mark.parametrize("first_final_only", [True, False])
def test_streamed_n_3_request_under_final_only_steps_now_and_then(llm: LLM, first_final_only: bool) -> None:
    """`step(final_only=True)` holds back a streamed request's outputs: a sample that finished in such a step
    shows its end with the request's next streamed output, the output that ends the last sample says finished
    (all samples, if a final_only step ends it), no sample ends twice or never, and the request leaves the engine
    (the invariants fixture checks that an idle engine keeps no group)."""
    params, want = staggered_params(llm, CUMULATIVE)
    engine = llm.engine
    rid = engine.add_request(PROMPT, params)
    outs: list[RequestOutput] = []
    final_only = first_final_only
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step(final_only=final_only) if o.request_id == rid]
        final_only = not final_only
    assert rid not in engine.groups
    assert outs and [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    # Ended in a final_only step, the request's last output holds every sample, as a FINAL_ONLY one; before it
    # each output holds one sample, and no sample ends twice.
    streamed = outs[:-1] if len(outs[-1].outputs) > 1 else outs
    assert all(len(o.outputs) == 1 for o in streamed)
    assert [c.index for c in outs[-1].outputs] in ([0, 1, 2], [outs[-1].outputs[0].index])
    ends = [o.outputs[0].index for o in streamed if o.outputs[0].finish_reason is not None]
    if len(outs[-1].outputs) == 1:
        assert sorted(ends) == [0, 1, 2]
    else:
        assert len(ends) == len(set(ends))
    for o in outs:
        for c in o.outputs:
            assert c.token_ids == want[c.index][: len(c.token_ids)]
