"""`SamplingParams.prompt_logprobs`, as in vLLM v1: `RequestOutput.prompt_logprobs` holds one entry per prompt
token, the first None; entry i >= 1 is a dict {token id: Logprob} holding prompt token i (first, with its rank)
and the k most likely tokens at position i - 1 (ranks 1..k), from the float32 log_softmax of the raw logits
there. -1 is the whole vocabulary; `max_logprobs` caps it as it caps `logprobs`.

The reference: the engine's own model run once over the whole prompt through the torch backend (no scheduler,
chunking, cache or sampler involved), and its logits' log_softmax at each position."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import roseinfer.runner.prompt_logprobs as prompt_logprobs_module
from roseinfer import LLM, InvalidRequestError, Logprob, RequestOutput, SamplingParams
from roseinfer.logprobs import TokenLogprobs
from roseinfer.request import Request
from tests.engine.test_logprobs import VOCAB, assert_close, check_outputs, check_position
from tests.engine.test_min_tokens import PROMPTS, count_calls, make
from tests.models.test_hf_parity import engine_prefill_logits

CHUNK = 8  # the token budget of a step where a test forces chunked prefill
# Shorter than, equal to and longer than a chunk (the last spanning three steps), and one token.
CHUNK_PROMPTS = [[40 + i for i in range(n)] for n in (5, CHUNK, 19, 1)]


def reference(llm: LLM, prompt: list[int]) -> torch.Tensor:
    """[len(prompt), V]: log_softmax of the model's logits at each prompt position, in one forward."""
    return engine_prefill_logits(llm, prompt).float().log_softmax(dim=-1)


def check_prompt(llm: LLM, prompt: list[int], got: list[dict[int, Logprob] | None] | None, k: int) -> None:
    """`got` against the reference: [None], then at each position the prompt token and the top k."""
    assert got is not None and len(got) == len(prompt), (got, prompt)
    assert got[0] is None
    if len(prompt) == 1:
        return
    ref = reference(llm, prompt)
    for i in range(1, len(prompt)):
        entry = got[i]
        assert entry is not None
        check_position(entry, prompt[i], ref[i - 1], k)


def generate(llm: LLM, prompts, params) -> list[RequestOutput]:
    return llm.generate(prompts, params, use_tqdm=False)


# -- validation -----------------------------------------------------------------------------------


def test_prompt_logprobs_defaults_to_none_and_is_validated():
    assert SamplingParams().prompt_logprobs is None
    for k in (0, 1, 20, -1):
        assert SamplingParams(prompt_logprobs=k).prompt_logprobs == k
    assert type(SamplingParams(prompt_logprobs=np.int64(3)).prompt_logprobs) is int
    for bad in (-2, 1.5, "3", True):
        with pytest.raises(ValueError, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad)


def test_prompt_logprobs_past_max_logprobs_are_refused_by_name(llama_dir):
    """As vLLM: the same cap as `logprobs` (-1 counting as the vocabulary); max_logprobs=-1 lifts it."""
    llm = make(llama_dir)
    ok = generate(llm, [[5, 6, 7]], SamplingParams(max_tokens=1, prompt_logprobs=20))[0]
    assert ok.prompt_logprobs is not None and len(ok.prompt_logprobs) == 3
    for k in (21, -1):
        with pytest.raises(InvalidRequestError, match="prompt_logprobs.*max_logprobs"):
            generate(llm, [[5, 6]], SamplingParams(max_tokens=2, prompt_logprobs=k))
    roomy = make(llama_dir, max_logprobs=-1)
    out = generate(roomy, [[5, 6]], SamplingParams(max_tokens=1, prompt_logprobs=-1))[0]
    assert len(out.prompt_logprobs[1]) == VOCAB


def test_no_prompt_logprobs_without_asking(llama_dir):
    out = generate(make(llama_dir), [PROMPTS[3]], SamplingParams(max_tokens=2, logprobs=1))[0]
    assert out.prompt_logprobs is None


# -- values ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("k", [0, 1, 5, -1])
def test_prompt_logprobs_are_the_raw_distribution_in_chunks(llama_dir, k, async_scheduling):
    """Prompts shorter than, equal to and longer than a step's budget (computed over one, one and three
    steps) and of one token, side by side: each gets its own list, equal to one forward over the prompt."""
    llm = make(llama_dir, async_scheduling, max_num_batched_tokens=CHUNK, max_logprobs=-1)
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=3, ignore_eos=True, prompt_logprobs=k)
    outs = generate(llm, CHUNK_PROMPTS, params)
    want = VOCAB if k == -1 else k
    for prompt, out in zip(CHUNK_PROMPTS, outs):
        check_prompt(llm, prompt, out.prompt_logprobs, want)
    assert outs[-1].prompt_logprobs == [None]  # a one-token prompt has no position before its token
    if k == -1:
        for entry in outs[2].prompt_logprobs[1:]:
            assert sorted(lp.rank for lp in entry.values()) == list(range(1, VOCAB + 1))
            assert math.isclose(sum(math.exp(lp.logprob) for lp in entry.values()), 1.0, rel_tol=1e-4)
    if k == 0:  # the prompt token alone, with its rank
        assert all(list(e) == [t] for e, t in zip(outs[2].prompt_logprobs[1:], CHUNK_PROMPTS[2][1:]))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_each_position_is_computed_once_in_bounded_slices(llama_dir, async_scheduling, monkeypatch):
    """The lm_head runs over at most `SLICE_ROWS` prompt rows at a time, and each position once: a 19-token
    prompt in chunks of 8 computes 18 positions (the last position's logits only sample)."""
    monkeypatch.setattr(prompt_logprobs_module, "SLICE_ROWS", 3)
    sizes: list[int] = []
    real = prompt_logprobs_module.compute_logprobs

    def spying(logits: torch.Tensor) -> torch.Tensor:
        sizes.append(logits.shape[0])
        return real(logits)

    monkeypatch.setattr(prompt_logprobs_module, "compute_logprobs", spying)
    llm = make(llama_dir, async_scheduling, max_num_batched_tokens=CHUNK)
    prompt = CHUNK_PROMPTS[2]
    out = generate(llm, [prompt], SamplingParams(max_tokens=2, prompt_logprobs=2))[0]
    check_prompt(llm, prompt, out.prompt_logprobs, 2)
    assert sum(sizes) == len(prompt) - 1 and max(sizes) <= 3


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_cached_prefix_is_not_read_but_blocks_are_registered(llama_dir, async_scheduling):
    """As vLLM v1: a request with prompt_logprobs computes its whole prompt though a prefix-cache hit is
    available (it needs every position's logits), and gets what an engine without the cache gives; its
    blocks still serve later requests."""
    prompt = PROMPTS[6]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, prompt_logprobs=3)
    plain = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm = make(llama_dir, async_scheduling)
    assert generate(llm, [prompt], plain)[0].num_cached_tokens == 0
    assert generate(llm, [prompt], plain)[0].num_cached_tokens > 0  # the hit is there to take
    hits = llm.engine.core.kv.num_hit_tokens
    got = generate(llm, [prompt], params)[0]
    assert got.num_cached_tokens == 0 and llm.engine.core.kv.num_hit_tokens == hits
    no_cache = make(llama_dir, async_scheduling, enable_prefix_caching=False)
    want = generate(no_cache, [prompt], params)[0]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    assert got.prompt_logprobs[0] is None and want.prompt_logprobs[0] is None
    assert_close(got.prompt_logprobs[1:], want.prompt_logprobs[1:])
    check_prompt(llm, prompt, got.prompt_logprobs, 3)
    fresh = make(llama_dir, async_scheduling)  # a prompt_logprobs request first: its blocks are registered
    generate(fresh, [prompt], params)
    assert generate(fresh, [prompt], plain)[0].num_cached_tokens > 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_n_samples_share_one_computation(llama_dir, async_scheduling, monkeypatch):
    calls = count_calls(monkeypatch, "prompt_logprobs_rows")
    llm = make(llama_dir, async_scheduling)
    prompt = PROMPTS[5]
    params = SamplingParams(temperature=1.0, seed=4, n=3, max_tokens=5, ignore_eos=True, prompt_logprobs=2)
    out = generate(llm, [prompt], params)[0]
    assert len(out.outputs) == 3
    check_prompt(llm, prompt, out.prompt_logprobs, 2)
    assert len(calls) == 1  # one step, the prompt's


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_together_with_sample_logprobs(llama_dir, async_scheduling):
    llm = make(llama_dir, async_scheduling, max_num_batched_tokens=CHUNK)
    ks = [(1, 3), (4, None), (None, 2), (0, 0)]
    ps = [
        SamplingParams(temperature=0.8, seed=i, max_tokens=6, ignore_eos=True, prompt_logprobs=p, logprobs=s)
        for i, (p, s) in enumerate(ks)
    ]
    outs = generate(llm, CHUNK_PROMPTS, ps)
    for prompt, out, (p, s) in zip(CHUNK_PROMPTS, outs, ks):
        if p is None:
            assert out.prompt_logprobs is None
        else:
            check_prompt(llm, prompt, out.prompt_logprobs, p)
        if s is None:
            assert out.outputs[0].logprobs is None
        else:
            check_outputs(llm, [prompt], [out], s)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_preemption_neither_duplicates_nor_loses_positions(llama_dir, async_scheduling):
    """A KV cache too small for everyone preempts requests (some in the middle of their chunked prompt) and
    recomputes them: each list still has one entry a prompt token, equal to a roomy engine's."""
    prompts = [[60 + (7 * i + j) % 300 for j in range(n)] for i, n in enumerate((30, 22, 17, 26, 9))]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, prompt_logprobs=2, n=2)
    tight = make(
        llama_dir,
        async_scheduling,
        cpu_kv_tokens=72,
        enable_prefix_caching=False,
        max_num_batched_tokens=CHUNK,
    )
    outs = generate(tight, prompts, params)
    assert tight.engine.core.scheduler.num_preemptions > 0
    roomy = generate(make(llama_dir, async_scheduling), prompts, params)
    for prompt, got, want in zip(prompts, outs, roomy):
        check_prompt(tight, prompt, got.prompt_logprobs, 2)
        assert [c.token_ids for c in got.outputs] == [c.token_ids for c in want.outputs]
        assert_close(got.prompt_logprobs[1:], want.prompt_logprobs[1:])


def test_a_request_preempted_in_its_prompt_recomputes_to_one_list(llama_dir, monkeypatch):
    """Preempted after two chunks resolved: its recompute from the start computes the logprobs of the positions
    it does not hold yet, and only those (18 positions in all)."""
    sizes: list[int] = []
    real = prompt_logprobs_module.compute_logprobs
    monkeypatch.setattr(
        prompt_logprobs_module, "compute_logprobs", lambda x: sizes.append(x.shape[0]) or real(x)
    )
    llm = make(llama_dir, async_scheduling=False, max_num_batched_tokens=CHUNK)
    engine, prompt = llm.engine, CHUNK_PROMPTS[2]
    rid = engine.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True, prompt_logprobs=1))
    root = engine.groups[rid].root
    engine.step()
    engine.step()  # two chunks of 8 resolved: positions 0..15
    assert root.prompt_logprobs is not None and len(root.prompt_logprobs) == 2 * CHUNK
    scheduler = engine.core.scheduler
    scheduler._preempt(root)  # as a full cache would
    last = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            last = out
    assert root.num_preemptions == 1 and last is not None and last.finished
    check_prompt(llm, prompt, last.prompt_logprobs, 1)
    assert sum(sizes) == len(prompt) - 1


def test_recomputed_positions_are_kept_once():
    """A chunk recomputed after a preemption while its first run was in flight (async scheduling) overlaps the
    positions held: those stay as they are, the new ones are appended; a chunk past the end is an error."""
    req = Request("r", list(range(10, 20)), SamplingParams(max_tokens=1, prompt_logprobs=0))
    entry = [TokenLogprobs([10 + p + 1], [-float(p)], p) for p in range(9)]
    req.add_prompt_logprobs(0, entry[0:4])
    req.add_prompt_logprobs(0, [TokenLogprobs([0], [0.0], 1)] * 2 + entry[2:6])  # positions 0..5
    assert req.prompt_logprobs == entry[0:6] and req.needs_prompt_logprobs
    with pytest.raises(RuntimeError, match="from position 7"):
        req.add_prompt_logprobs(7, entry[7:9])
    req.add_prompt_logprobs(6, entry[6:9])
    assert req.prompt_logprobs == entry and not req.needs_prompt_logprobs


# -- delivery -------------------------------------------------------------------------------------


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_streamed_outputs_all_carry_the_prompt_logprobs(model_with_tokenizer, async_scheduling):
    """Every output of a request, from its first (after the prompt), holds the whole list, the same each time
    (vLLM's cumulative and final outputs do); each token decoded alone."""
    llm = make(model_with_tokenizer, async_scheduling, max_num_batched_tokens=CHUNK)
    engine = llm.engine
    text = "Hello world! How are you doing today?"
    prompt = llm.tokenizer.encode(text)
    assert len(prompt) > CHUNK
    rid = engine.add_request(text, SamplingParams(temperature=0.0, max_tokens=5, prompt_logprobs=2, n=2))
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == rid]
    assert len(outs) >= 5 and outs[-1].finished
    check_prompt(llm, prompt, outs[0].prompt_logprobs, 2)
    assert all(o.prompt_logprobs == outs[0].prompt_logprobs for o in outs)
    tok = llm.tokenizer
    for entry in outs[0].prompt_logprobs[1:]:
        assert all(lp.decoded_token == tok.decode([t]) for t, lp in entry.items())


def test_prompt_logprob_steps_run_eager_and_others_as_before(llama_dir, monkeypatch):
    """Where decode and mixed-step graphs serve: a step holding prompt-logprob work runs the eager forward
    (it needs every row's hidden state), the decode steps after it still replay graphs; a run without
    prompt_logprobs takes none of this work and the same paths as before."""
    rows = count_calls(monkeypatch, "prompt_logprobs_rows")
    llm = make(llama_dir, graphs=True)
    runner = llm.engine.core.runner
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    generate(llm, PROMPTS, params)
    before = dict(runner.step_paths)
    assert not rows and before["eager"] == 0 and before["mixed_graph"] > 0 and before["decode_graph"] > 0
    # The longest prompt (30 tokens, two steps) asks; no prefix-cache hits from the first run.
    asked = [params] * (len(PROMPTS) - 1) + [
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=3)
    ]
    prompts = [[p + 1 for p in prompt] for prompt in PROMPTS]
    outs = generate(llm, prompts, asked)
    check_prompt(llm, prompts[-1], outs[-1].prompt_logprobs, 3)
    paths = {k: runner.step_paths[k] - before[k] for k in before}
    assert rows and paths["eager"] == len(rows) and paths["decode_graph"] > 0
