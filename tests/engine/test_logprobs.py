"""`SamplingParams.logprobs`, as in vLLM v1 (its default `logprobs_mode="raw_logprobs"`): for each generated token,
a dict {token id: Logprob(logprob, rank, decoded_token)} holding the sampled token (first) and the k most likely
tokens, the log-probabilities being the float32 log_softmax of the raw model logits, before temperature, min_tokens'
mask, min-p, top-k or top-p; rank is the 1-based rank in that distribution (top-k entries 1..k, the sampled token
the number of tokens at least as likely). `CompletionOutput.cumulative_logprob` sums the sampled tokens'.

The reference: the engine's own model run over the whole sequence (prompt and generated tokens) as one prefill
through the torch backend, with no sampler, scheduler or graph involved; its logits' log_softmax at the
positions that predict each generated token."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from roseinfer import LLM, InvalidRequestError, Logprob, SamplingParams
from roseinfer.outputs import CompletionOutput
from roseinfer.request import Request
from tests.engine.test_min_tokens import PROMPTS, count_calls, make, prefer
from tests.models.test_hf_parity import engine_prefill_logits

VOCAB = 384  # the tiny llama's
TOL = 1e-4  # float32 logprobs of a paged, batched run against one whole-sequence forward

SAMPLING = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.7),
    "seeded": dict(temperature=1.3, seed=11),
    "top_k": dict(temperature=0.8, top_k=5),
    "top_p_min_p": dict(temperature=1.0, top_p=0.8, min_p=0.05),
}


def reference(llm: LLM, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """[len(tokens), V]: log_softmax of the model's logits at each generated token's position."""
    logits = engine_prefill_logits(llm, prompt + tokens[:-1])
    return logits[len(prompt) - 1 :].float().log_softmax(dim=-1)


def check_position(
    entry: dict[int, Logprob], token: int, ref: torch.Tensor, k: int, tol: float = TOL
) -> None:
    """One position's dict against the reference distribution `ref` [V], values within `tol`."""
    assert next(iter(entry)) == token, "the sampled token comes first"
    assert len(entry) in (k, k + 1) and len(entry) >= 1, entry
    for tid, lp in entry.items():
        assert isinstance(lp, Logprob) and isinstance(lp.logprob, float) and isinstance(lp.rank, int)
        assert abs(lp.logprob - float(ref[tid])) < tol, (tid, lp, float(ref[tid]))
    # the top k (the sampled token among them where the dict holds only k): ranks 1..k in order of logprob,
    # and no token outside them more likely (within rounding)
    top = [t for t in entry if t != token or len(entry) == k]
    assert sorted(entry[t].rank for t in top) == list(range(1, k + 1)), entry
    top.sort(key=lambda t: entry[t].rank)
    values = [entry[t].logprob for t in top]
    assert values == sorted(values, reverse=True)
    rest = torch.ones(len(ref), dtype=torch.bool)
    rest[top] = False
    if k and rest.any():
        assert float(ref[top].min()) >= float(ref[rest].max()) - tol
    # the sampled token's rank: how many tokens are at least as likely (ties within rounding either way)
    v = float(ref[token])
    rank = entry[token].rank
    if token not in top:
        assert int((ref > v + tol).sum()) + 1 <= rank <= int((ref >= v - tol).sum()), (rank, v)


def check_sample(llm: LLM, prompt: list[int], c: CompletionOutput, k: int, tol: float = TOL) -> None:
    assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids), (len(c.logprobs), c.token_ids)
    ref = reference(llm, prompt, c.token_ids)
    total = 0.0
    for i, (entry, token) in enumerate(zip(c.logprobs, c.token_ids)):
        check_position(entry, token, ref[i], k, tol)
        total += entry[token].logprob
    assert c.cumulative_logprob is not None and math.isclose(c.cumulative_logprob, total, rel_tol=1e-12)


def assert_close(got: list[dict[int, Logprob]], want: list[dict[int, Logprob]]) -> None:
    """The same tokens, ranks and texts at each position, logprobs within rounding (another batch)."""
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert list(a) == list(b) and all(a[t].rank == b[t].rank for t in a)
        assert all(
            abs(a[t].logprob - b[t].logprob) < TOL and a[t].decoded_token == b[t].decoded_token for t in a
        )


def check_outputs(llm: LLM, prompts, outs, k: int, tol: float = TOL) -> None:
    for prompt, out in zip(prompts, outs):
        for c in out.outputs:
            check_sample(llm, prompt, c, k, tol)


# -- validation -----------------------------------------------------------------------------------


def test_logprobs_defaults_to_none_and_is_validated():
    assert SamplingParams().logprobs is None
    for k in (0, 1, 20, -1):
        assert SamplingParams(logprobs=k).logprobs == k
    assert type(SamplingParams(logprobs=np.int64(3)).logprobs) is int
    for bad in (-2, 1.5, "3", True):
        with pytest.raises(ValueError, match="logprobs"):
            SamplingParams(logprobs=bad)


def test_logprobs_past_max_logprobs_are_refused_by_name(llama_dir):
    """As vLLM: at most `max_logprobs` (20 by default) a token; -1 (the whole vocabulary) counts as the
    vocabulary's size; max_logprobs=-1 lifts the cap."""
    llm = make(llama_dir)
    ok = llm.generate([[5, 6]], SamplingParams(max_tokens=2, logprobs=20), use_tqdm=False)[0].outputs[0]
    assert ok.logprobs is not None and len(ok.logprobs) == 2
    for k in (21, -1):
        with pytest.raises(InvalidRequestError, match="max_logprobs"):
            llm.generate([[5, 6]], SamplingParams(max_tokens=2, logprobs=k), use_tqdm=False)
    with pytest.raises(ValueError, match="max_logprobs"):
        make(llama_dir, max_logprobs=-2)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_whole_vocabulary_with_logprobs_minus_one(llama_dir, async_scheduling):
    llm = make(llama_dir, async_scheduling, max_logprobs=-1)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=4, logprobs=-1)
    out = llm.generate([PROMPTS[2]], params, use_tqdm=False)[0]
    c = out.outputs[0]
    assert all(len(entry) == VOCAB for entry in c.logprobs)
    check_outputs(llm, [PROMPTS[2]], [out], VOCAB)
    for entry in c.logprobs:  # ranks 1..V, and the probabilities sum to one
        assert sorted(lp.rank for lp in entry.values()) == list(range(1, VOCAB + 1))
        assert math.isclose(sum(math.exp(lp.logprob) for lp in entry.values()), 1.0, rel_tol=1e-4)


def test_no_logprobs_without_asking(llama_dir):
    c = make(llama_dir).generate([PROMPTS[1]], SamplingParams(max_tokens=3), use_tqdm=False)[0].outputs[0]
    assert c.logprobs is None and c.cumulative_logprob is None


# -- values ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("sampling", sorted(SAMPLING))
def test_logprobs_are_the_raw_distribution(llama_dir, sampling, async_scheduling, graphs):
    """Whatever the sampling settings (temperature, top-k, top-p, min-p leave the logprobs alone), each
    position holds the sampled token and the top 4 of the raw distribution, with their ranks."""
    llm = make(llama_dir, async_scheduling, graphs)
    params = SamplingParams(max_tokens=9, ignore_eos=True, logprobs=4, **SAMPLING[sampling])
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    check_outputs(llm, PROMPTS, outs, 4)
    if graphs:
        paths = llm.engine.core.runner.step_paths
        assert paths["decode_graph"] > 0 and paths["mixed_graph"] > 0
    if sampling != "greedy":  # some sampled token outside the top 4: the dict then holds 5 entries
        assert any(len(e) == 5 for o in outs for e in o.outputs[0].logprobs)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_rows_of_one_batch_get_their_own_number(llama_dir, async_scheduling, graphs):
    """logprobs None, 0, 1, 3 and 7 side by side: each row its own count (0: the sampled token alone)."""
    llm = make(llama_dir, async_scheduling, graphs)
    ks = [None, 0, 1, 3, 7, None, 0]
    ps = [SamplingParams(temperature=1.0, max_tokens=7, ignore_eos=True, logprobs=k) for k in ks]
    outs = llm.generate(PROMPTS, ps, use_tqdm=False)
    for prompt, out, k in zip(PROMPTS, outs, ks):
        c = out.outputs[0]
        if k is None:
            assert c.logprobs is None and c.cumulative_logprob is None
        else:
            check_sample(llm, prompt, c, k)
            if k == 0:
                assert all(list(e) == [t] for e, t in zip(c.logprobs, c.token_ids))


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_sampled_tokens_are_those_drawn_without_logprobs(llama_dir, async_scheduling, graphs):
    """Asking for logprobs draws no random number and moves no row out of the decode graph: fresh engines
    (same engine seed, same global generator) draw the same tokens with logprobs off, on, and on for some
    rows. Two batches: every sampling kind (sampled outside the graphs: some row has top-k or a seed), then
    greedy and plain temperature rows only (sampled inside them)."""
    kinds = [SAMPLING[s] for s in sorted(SAMPLING)]
    plain = [SAMPLING["greedy"], SAMPLING["temperature"], SAMPLING["temperature"]]

    def run(logprobs: list[int | None]) -> list[list[int]]:
        llm = make(llama_dir, async_scheduling, graphs)
        torch.manual_seed(0)  # the CPU stand-in graphs draw from the global generator
        got = []
        for mix in (kinds, plain):
            ps = [
                SamplingParams(max_tokens=9, ignore_eos=True, logprobs=k, **mix[i % len(mix)])
                for i, k in enumerate(logprobs)
            ]
            outs = llm.generate(PROMPTS, ps, use_tqdm=False)
            got += [c.token_ids for o in outs for c in o.outputs]
        return got

    n = len(PROMPTS)
    want = run([None] * n)
    assert run([5] * n) == want
    assert run([2 if i % 2 else None for i in range(n)]) == want


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_decode_graphs_still_sample_rows_that_want_logprobs(llama_dir, async_scheduling, monkeypatch):
    """The logprobs come from the logits the decode graph returns, beside the tokens it drew: a decode step
    with logprobs rows is not moved to the sampler outside the graph."""
    outside = count_calls(monkeypatch, "sample")
    llm = make(llama_dir, async_scheduling, graphs=True)
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, logprobs=2)
    out = llm.generate([PROMPTS[3]], params, use_tqdm=False)
    check_outputs(llm, [PROMPTS[3]], out, 2)
    runner = llm.engine.core.runner
    assert len(outside) == 1 and runner.step_paths["decode_graph"] == 7  # the prefill's token alone outside


def test_steps_without_logprobs_compute_none(llama_dir, monkeypatch):
    """A batch where no row asks for logprobs takes none of the logprobs work."""
    calls = count_calls(monkeypatch, "compute_logprobs")
    llm = make(llama_dir, graphs=True)
    llm.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=6), use_tqdm=False)
    assert not calls
    llm.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=6, logprobs=1), use_tqdm=False)
    assert calls


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("sampling", ["temperature", "seeded"])
def test_each_of_n_samples_has_its_own_logprobs(llama_dir, sampling, async_scheduling):
    llm = make(llama_dir, async_scheduling, graphs=True)
    params = SamplingParams(max_tokens=8, n=2, ignore_eos=True, logprobs=3, **SAMPLING[sampling])
    outs = llm.generate(PROMPTS[:4], params, use_tqdm=False)
    assert all(len(o.outputs) == 2 for o in outs)
    assert any(o.outputs[0].token_ids != o.outputs[1].token_ids for o in outs)
    check_outputs(llm, PROMPTS[:4], outs, 3)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_min_tokens_mask_is_not_in_the_logprobs(llama_dir, async_scheduling, graphs):
    """vLLM's raw logprobs are taken before min_tokens masks the stop ids: while a request may not stop, its
    favourite stop token is still the most likely at rank 1, and the tokens it draws instead rank lower. Eager
    steps mask the logits in place as they sample; graph replays draw inside the graph."""
    llm = make(llama_dir, async_scheduling, graphs=graphs)
    favourite, k = 77, 4
    prefer(llm, favourite)
    params = SamplingParams(
        temperature=0.0, max_tokens=9, min_tokens=k, stop_token_ids=[favourite], logprobs=1
    )
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    check_outputs(llm, PROMPTS, outs, 1)
    for out in outs:
        c = out.outputs[0]
        assert len(c.token_ids) == k + 1 and c.token_ids[k] == favourite
        for entry, token in zip(c.logprobs[:k], c.token_ids):
            assert entry[favourite].rank == 1 and entry[favourite].logprob > -1e-3
            assert entry[token].rank == 2 and entry[token].logprob < -20
        assert list(c.logprobs[k]) == [favourite] and c.logprobs[k][favourite].rank == 1


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_preempted_requests_keep_their_logprobs(llama_dir, async_scheduling):
    """Recompute after preemption keeps the logprobs of the tokens it already has (one entry a token, none
    repeated) and adds those of the tokens drawn after it; they equal a run with room for everyone."""
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)
    tight = make(llama_dir, async_scheduling, graphs=True, cpu_kv_tokens=64, enable_prefix_caching=False)
    outs = tight.generate(PROMPTS, params, use_tqdm=False)
    assert tight.engine.core.scheduler.num_preemptions > 0
    check_outputs(tight, PROMPTS, outs, 2)
    roomy = make(llama_dir, async_scheduling, graphs=True).generate(PROMPTS, params, use_tqdm=False)
    for got, want in zip(outs, roomy):
        g, w = got.outputs[0], want.outputs[0]
        assert g.token_ids == w.token_ids
        assert_close(g.logprobs, w.logprobs)


# -- text: stop strings, stop ids, streaming, decoded tokens ---------------------------------------


@pytest.mark.parametrize("include", [False, True], ids=["trimmed", "included"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_stop_string_keeps_one_entry_a_token(model_with_tokenizer, async_scheduling, include, monkeypatch):
    """A stop string in the earlier of two tokens that one engine step resolves (async scheduling) drops the
    later token, and its logprobs with it; `include_stop_str_in_output` changes the text, not the tokens."""

    def run(stop: list[str] | None) -> tuple[LLM, CompletionOutput]:
        # A fresh engine each (a prefix-cache hit would change the steps), with the prompts and budget of
        # tests/engine/test_async_stop_string_two_tokens_per_step.py: under async scheduling the step after
        # the first resolves the first two tokens of request 0 at once.
        llm = make(model_with_tokenizer, async_scheduling, max_num_batched_tokens=4)
        params = [
            SamplingParams(
                temperature=0.0,
                max_tokens=12,
                ignore_eos=True,
                logprobs=2,
                stop=stop,
                include_stop_str_in_output=include,
            ),
            SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, n=2),
        ]
        return llm, llm.generate(prompts, params, use_tqdm=False)[0].outputs[0]

    prompts = [[5], list(range(20, 26))]
    llm, free = run(None)
    check_sample(llm, prompts[0], free, 2)
    first = llm.tokenizer.decode(free.token_ids[:1])
    dropped = []
    real = Request.drop_last_tokens

    def dropping(req: Request, count: int) -> None:
        dropped.append(count)
        real(req, count)

    monkeypatch.setattr(Request, "drop_last_tokens", dropping)
    llm, got = run([first])
    assert dropped == [1 if async_scheduling else 0]  # the token after the stop string, under async
    assert got.finish_reason == "stop" and got.token_ids == free.token_ids[:1]
    assert got.text == (first if include else "")
    assert len(got.logprobs) == 1 and list(got.logprobs[0]) == list(free.logprobs[0])
    check_sample(llm, prompts[0], got, 2)


def test_a_stop_token_keeps_its_logprobs(llama_dir):
    llm = make(llama_dir)
    prefer(llm, 77, bias=3.0)
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=30, stop_token_ids=[77], logprobs=1)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    stopped = [o.outputs[0] for o in outs if o.outputs[0].finish_reason == "stop"]
    assert stopped and all(c.token_ids[-1] == 77 and 77 in c.logprobs[-1] for c in stopped)
    check_outputs(llm, PROMPTS, outs, 1)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_streamed_logprobs_extend_with_the_tokens(model_with_tokenizer, async_scheduling):
    """Each streamed output holds one entry per token so far, the earlier ones unchanged, and the running
    cumulative logprob; the last equals `generate`'s."""
    llm = make(model_with_tokenizer, async_scheduling)
    params = SamplingParams(temperature=0.9, seed=2, max_tokens=10, ignore_eos=True, logprobs=3, n=2)
    engine = llm.engine
    rid = engine.add_request("Hello world", params)
    seen: dict[int, list] = {}
    last: dict[int, CompletionOutput] = {}  # each sample's last output (a streamed output holds one sample)
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == rid
            for c in out.outputs:
                assert len(c.logprobs) == len(c.token_ids)
                before = seen.get(c.index, [])
                assert c.logprobs[: len(before)] == before
                assert math.isclose(
                    c.cumulative_logprob, sum(e[t].logprob for e, t in zip(c.logprobs, c.token_ids))
                )
                seen[c.index] = list(c.logprobs)
                last[c.index] = c
    whole = llm.generate("Hello world", params, use_tqdm=False)[0]  # its prompt now a prefix-cache hit
    streamed_last = [last[i] for i in sorted(last)]
    assert [c.token_ids for c in streamed_last] == [c.token_ids for c in whole.outputs]
    for streamed, done in zip(streamed_last, whole.outputs):
        assert_close(streamed.logprobs, done.logprobs)
    prompt = llm.tokenizer.encode("Hello world")
    check_outputs(llm, [prompt], [whole], 3)


def test_decoded_tokens_are_each_tokens_text(model_with_tokenizer, llama_dir):
    """As vLLM: each token decoded alone (None where the engine has no tokenizer)."""
    llm = make(model_with_tokenizer)
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=6, ignore_eos=True, logprobs=3)
    c = llm.generate("Hello world", params, use_tqdm=False)[0].outputs[0]
    tok = llm.tokenizer
    assert all(lp.decoded_token == tok.decode([t]) for e in c.logprobs for t, lp in e.items())
    c = make(llama_dir).generate([PROMPTS[0]], params, use_tqdm=False)[0].outputs[0]
    assert all(lp.decoded_token is None for e in c.logprobs for lp in e.values())
