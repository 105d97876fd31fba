"""`SamplingParams.min_tokens`, as in vLLM v1: until a sequence has generated min_tokens tokens, its stop token
ids and the eos ids cannot be sampled (their logits are -inf; eos even under `ignore_eos`), and no stop string
ends it (the text of its first min_tokens tokens is never searched, though a match may begin there and end
after). Each sample of an n > 1 request counts its own tokens.

The tiny random model is made to prefer one token above all others (a large bias on its logit, added in
`compute_logits`, which every sampling path calls on the CPU): without min_tokens a request that stops on that
token stops at its first token, with min_tokens=k it must generate exactly k other tokens first."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import roseinfer.runner.model_runner as model_runner
from roseinfer import LLM, SamplingParams
from roseinfer.request import Request
from tests.engine.cpu_graph_replay import cpu_decode_graphs, cpu_mixed_graphs

PROMPTS = [[11 + i for i in range(n)] for n in (1, 3, 4, 5, 9, 17, 30)]
FAVOURITE = 77  # the token the biased model prefers (the tiny llama's eos is 2, its vocabulary 384)
EOS = 2
K = 5


def make(model_dir: str, async_scheduling: bool = True, graphs: bool = False, **kw) -> LLM:
    kw.setdefault("cpu_kv_tokens", 2048)
    if graphs:  # prompts in chunks beside decodes: steps with prefill work replay mixed-step graphs
        kw.setdefault("max_num_batched_tokens", 16)
    llm = LLM(model_dir, device="cpu", dtype="float32", block_size=4, async_scheduling=async_scheduling, **kw)
    if graphs:  # decode and mixed-step graphs whose replays run on the CPU (tests/engine/cpu_graph_replay.py)
        runner = llm.engine.core.runner
        runner.graphs, _ = cpu_decode_graphs(runner, 8)
        runner.mixed_graphs, _ = cpu_mixed_graphs(runner, 32)
    return llm


def prefer(llm: LLM, token: int, bias: float = 40.0) -> None:
    """Every row's logits get `bias` on `token`: greedy picks it, and a draw at temperature <= 1 too."""
    model = llm.engine.core.runner.model
    real = model.compute_logits

    def biased(hidden: torch.Tensor) -> torch.Tensor:
        logits = real(hidden)
        logits[:, token] += bias
        return logits

    model.compute_logits = biased


def count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Counts the runner's calls of `model_runner.<name>`: one entry a call."""
    calls: list[int] = []
    real = getattr(model_runner, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(model_runner, name, counting)
    return calls


SAMPLING = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=1.0),
    "seeded": dict(temperature=1.0, seed=7),
    "top_k": dict(temperature=0.8, top_k=20),
    "min_p": dict(temperature=1.0, min_p=0.01),
}


def assert_held_off(outs, stop: int, k: int, stop_reason: int | None) -> None:
    """Each sample generated k tokens other than `stop`, then `stop` (its favourite) ended it."""
    for o in outs:
        for c in o.outputs:
            assert stop not in c.token_ids[:k], (o.request_id, c.token_ids)
            assert len(c.token_ids) == k + 1 and c.token_ids[k] == stop, (o.request_id, c.token_ids)
            assert c.finish_reason == "stop" and c.stop_reason == stop_reason


# -- validation -----------------------------------------------------------------------------------


def test_min_tokens_defaults_to_zero_and_is_validated():
    assert SamplingParams().min_tokens == 0
    assert SamplingParams(min_tokens=4, max_tokens=4).min_tokens == 4
    assert SamplingParams(min_tokens=10**6, max_tokens=None).min_tokens == 10**6
    assert type(SamplingParams(min_tokens=np.int64(3)).min_tokens) is int
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=-1)
    with pytest.raises(ValueError, match="min_tokens.*max_tokens"):
        SamplingParams(min_tokens=5, max_tokens=4)
    for bad in (1.5, "3", None):
        with pytest.raises(ValueError, match="min_tokens"):
            SamplingParams(min_tokens=bad)


def test_a_stop_token_before_min_tokens_does_not_end_the_request():
    """As vLLM's stop check: no stop token ends a sequence of fewer than min_tokens tokens (the sampler
    never draws one there; this is the check behind it)."""
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=8, min_tokens=3, stop_token_ids=[9]), (EOS,))
    for token in (9, EOS):
        req.append_token(token)
        assert req.check_stop_token(100) is None
    req.append_token(9)
    assert req.check_stop_token(100) is not None and req.stop_reason == 9


# -- stop token ids and eos -----------------------------------------------------------------------


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("sampling", sorted(SAMPLING))
def test_stop_token_ids_are_masked_until_min_tokens(llama_dir, sampling, async_scheduling, graphs):
    llm = make(llama_dir, async_scheduling, graphs)
    prefer(llm, FAVOURITE)
    params = SamplingParams(max_tokens=12, stop_token_ids=[FAVOURITE], **SAMPLING[sampling])
    # min_tokens=0: the favourite comes first and stops each request at once
    assert_held_off(llm.generate(PROMPTS, params, use_tqdm=False), FAVOURITE, 0, FAVOURITE)
    outs = llm.generate(PROMPTS, replace(params, min_tokens=K), use_tqdm=False)
    assert_held_off(outs, FAVOURITE, K, FAVOURITE)
    if graphs:
        paths = llm.engine.core.runner.step_paths
        assert paths["decode_graph"] > 0 and paths["mixed_graph"] > 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_each_row_is_masked_by_its_own_count(llama_dir, async_scheduling):
    """Rows of one batch with min_tokens 0, 1, 3 and 7: each stops right after its own min_tokens."""
    llm = make(llama_dir, async_scheduling, graphs=True)
    prefer(llm, EOS)
    mins = [0, 1, 3, 7, 0, 3, 7]
    ps = [SamplingParams(temperature=0.0, max_tokens=12, min_tokens=m) for m in mins]
    for out, m in zip(llm.generate(PROMPTS, ps, use_tqdm=False), mins):
        assert_held_off([out], EOS, m, None)  # eos: no stop reason, as vLLM


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("sampling", ["temperature", "seeded"])
def test_each_of_n_samples_counts_its_own_tokens(llama_dir, sampling, async_scheduling):
    llm = make(llama_dir, async_scheduling, graphs=True)
    prefer(llm, FAVOURITE)
    params = SamplingParams(max_tokens=12, n=2, stop_token_ids=[FAVOURITE], **SAMPLING[sampling])
    outs = llm.generate(PROMPTS[:4], params, use_tqdm=False)
    assert all(len(o.outputs) == 2 for o in outs)
    assert_held_off(outs, FAVOURITE, 0, FAVOURITE)
    outs = llm.generate(PROMPTS[:4], replace(params, min_tokens=K), use_tqdm=False)
    assert all(len(o.outputs) == 2 for o in outs)
    assert_held_off(outs, FAVOURITE, K, FAVOURITE)


@pytest.mark.parametrize(("sampling", "n"), [("greedy", 1), ("temperature", 1), ("temperature", 2)])
def test_eos_is_masked_until_min_tokens_even_with_ignore_eos(llama_dir, sampling, n):
    """vLLM counts eos among a request's stop ids for min_tokens whatever `ignore_eos` says: it is not
    drawn before min_tokens, and after that it is an ordinary token. The forks of an n > 1 request too (they
    are built without the eos ids that `ignore_eos` drops from the stop check)."""
    llm = make(llama_dir, graphs=True)
    prefer(llm, EOS)
    params = SamplingParams(max_tokens=K + 3, ignore_eos=True, min_tokens=K, n=n, **SAMPLING[sampling])
    for out in llm.generate(PROMPTS, params, use_tqdm=False):
        assert len(out.outputs) == n
        for c in out.outputs:
            ids = c.token_ids
            assert EOS not in ids[:K] and ids[K:] == [EOS] * 3 and c.finish_reason == "length", ids


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_graph_sampling_resumes_once_min_tokens_is_reached(llama_dir, async_scheduling, monkeypatch):
    """A batch with a row under min_tokens is sampled outside the decode graph (on the logits it returns,
    masked); from the step at which no row is under it, the graph samples again."""
    llm = make(llama_dir, async_scheduling, graphs=True)
    prefer(llm, EOS)
    outside = count_calls(monkeypatch, "sample")
    params = SamplingParams(temperature=0.0, max_tokens=K + 6, min_tokens=K, ignore_eos=True)
    ids = llm.generate([PROMPTS[3]], params, use_tqdm=False)[0].outputs[0].token_ids
    assert EOS not in ids[:K] and ids[K:] == [EOS] * 6
    runner = llm.engine.core.runner
    # the prefill's token and the K - 1 decode steps under min_tokens; the other 6 steps sample in the graph
    assert len(outside) == K and runner.num_launches == K + 6
    assert runner.step_paths["decode_graph"] == K + 5


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_preempted_requests_keep_their_count(llama_dir, async_scheduling):
    """Recompute after preemption samples the next token of a sequence that already has some: its count
    is its output so far, not zero and not the recomputed tokens."""
    llm = make(llama_dir, async_scheduling, graphs=True, cpu_kv_tokens=64, enable_prefix_caching=False)
    prefer(llm, FAVOURITE)
    params = SamplingParams(temperature=0.0, max_tokens=24, min_tokens=20, stop_token_ids=[FAVOURITE])
    assert_held_off(llm.generate(PROMPTS, params, use_tqdm=False), FAVOURITE, 20, FAVOURITE)
    assert llm.engine.core.scheduler.num_preemptions > 0


def test_min_tokens_past_the_room_of_max_tokens_none(llama_dir):
    """`max_tokens=None` resolves to what the context leaves: a larger min_tokens masks every token to it
    (vLLM does not re-check it against the resolved max_tokens)."""
    llm = make(llama_dir, max_model_len=24)
    prefer(llm, FAVOURITE)
    params = SamplingParams(temperature=0.0, max_tokens=None, min_tokens=1000, stop_token_ids=[FAVOURITE])
    out = llm.generate([PROMPTS[3]], params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 24 - 5 and FAVOURITE not in out.token_ids and out.finish_reason == "length"


# -- stop strings ---------------------------------------------------------------------------------


def texts_by_token(model_dir: str, prompt: str, params: SamplingParams) -> list[str]:
    """The output text after each token, streamed one token a step (synchronous scheduling)."""
    engine = make(model_dir, async_scheduling=False).engine
    engine.add_request(prompt, params)
    texts = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts.append(out.outputs[0].text)
            assert len(out.outputs[0].token_ids) == len(texts)
    return texts


def vllm_stop(full: str, head_end: int, stop: str) -> tuple[str, str]:
    """vLLM's result: a stop string counts only where it ends past the first min_tokens tokens' text."""
    hit = full.find(stop, max(0, head_end - len(stop) + 1))
    return (full[:hit], "stop") if hit >= 0 else (full, "length")


@pytest.mark.parametrize("where", ["inside", "straddling", "recurring", "beside_a_longer_one"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_stop_strings_are_not_checked_within_min_tokens(model_with_tokenizer, where, async_scheduling):
    prompt, k = "Hello world", 4
    base = SamplingParams(temperature=0.0, max_tokens=12, min_tokens=k, ignore_eos=True)
    texts = texts_by_token(model_with_tokenizer, prompt, base)
    full, head = texts[-1], texts[k - 1]
    assert len(texts) == 12 and full.startswith(head) and len(head) >= 3
    if where == "inside":  # only inside the first k tokens' text
        stop = next(head[i : i + 2] for i in range(len(head) - 1) if full.count(head[i : i + 2]) == 1)
    elif where == "straddling":  # begins inside it, ends after it
        stop = full[len(head) - 1 : len(head) + 1]
    elif where == "recurring":  # inside it, and again after it
        stop = next(head[i : i + 1] for i in range(len(head)) if head[i] in full[len(head) :])
    else:  # near its end, with a longer stop string (that never matches) beside it
        stop = head[-2]
    stops = [stop] + (["zzzzzzzz"] if where == "beside_a_longer_one" else [])
    assert "zzzzzzzz" not in full
    assert full.find(stop) < len(head)  # its first match begins inside the first k tokens' text
    llm = make(model_with_tokenizer, async_scheduling)
    out = llm.generate(prompt, replace(base, stop=stops), use_tqdm=False)[0].outputs[0]
    text, reason = vllm_stop(full, len(head), stop)
    assert (out.text, out.finish_reason) == (text, reason), stop
    assert out.stop_reason == (stop if reason == "stop" else None)
    # without min_tokens, the first match ends the text: inside the first k tokens' unless it straddles
    plain = llm.generate(prompt, replace(base, stop=stops, min_tokens=0), use_tqdm=False)[0].outputs[0]
    assert plain.finish_reason == "stop" and plain.text == full[: full.find(stop)]
    assert len(plain.token_ids) <= k or where == "straddling"
