"""The offline API's contract with its callers, as vLLM users expect it: prompt shapes, parameter limits,
stop tokens and reasons, eos ids from generation_config.json, the engine seed. Each test failed before its fix."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from roseinfer import LLM, InvalidRequestError, SamplingParams


@pytest.fixture(scope="module")
def llm(model_with_tokenizer: str) -> LLM:
    return LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=2048)


def greedy(n: int = 4, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, **kw)


def assert_serving(llm: LLM) -> None:
    """Nothing left queued, and the next call runs."""
    assert not llm.engine.has_unfinished_requests() and not llm.engine.groups
    out = llm.generate([[5, 6, 7]], greedy(ignore_eos=True), use_tqdm=False)
    assert len(out) == 1 and len(out[0].outputs[0].token_ids) == 4


def test_a_single_dict_prompt_is_one_prompt(llm: LLM) -> None:
    want = llm.generate([[5, 6, 7]], greedy(), use_tqdm=False)[0]
    got = llm.generate({"prompt_token_ids": [5, 6, 7]}, greedy(), use_tqdm=False)
    assert len(got) == 1 and got[0].prompt_token_ids == [5, 6, 7]
    assert got[0].outputs[0].token_ids == want.outputs[0].token_ids


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, -(2**70)])
def test_a_seed_out_of_a_generator_range_is_refused_by_name(seed: int) -> None:
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(temperature=1.0, seed=seed)


def test_a_top_k_past_the_vocabulary_samples_the_whole_vocabulary(llm: LLM) -> None:
    huge = SamplingParams(temperature=1.0, top_k=2**63, max_tokens=4, seed=3, ignore_eos=True)
    whole = SamplingParams(temperature=1.0, max_tokens=4, seed=3, ignore_eos=True)
    got, want = llm.generate([[5, 6, 7], [5, 6, 7]], [huge, whole], use_tqdm=False)
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    assert_serving(llm)


def test_untokenizable_text_is_a_value_error_and_the_other_prompts_still_run(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError) as info:
        llm.generate(["hello world", "bad \ud800 surrogate", [5, 6, 7]], greedy(), use_tqdm=False)
    err = info.value
    assert list(err.errors) == [1] and "tokenized" in str(err.errors[1]) and err.outputs[1] is None
    assert err.outputs[0].finished and err.outputs[2].finished
    assert_serving(llm)


def test_negative_max_model_len_is_a_value_error(model_with_tokenizer: str) -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=512, max_model_len=-5)


def test_generation_config_eos_ids_stop_generation(model_with_tokenizer: str, tmp_path) -> None:
    model = tmp_path / "m"
    shutil.copytree(model_with_tokenizer, model)
    ids = (
        LLM(str(model), device="cpu", block_size=4, cpu_kv_tokens=512)
        .generate([[5, 6, 7]], greedy(10), use_tqdm=False)[0]
        .outputs[0]
        .token_ids
    )
    eos = ids[2]
    assert eos not in ids[:2] and 0 not in ids[:3]
    (model / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": [0, eos]}))
    out = (
        LLM(str(model), device="cpu", block_size=4, cpu_kv_tokens=512)
        .generate([[5, 6, 7]], greedy(10), use_tqdm=False)[0]
        .outputs[0]
    )
    assert out.finish_reason == "stop" and out.token_ids == ids[:3]
    assert out.stop_reason is None  # an eos id, as vLLM reports it


def test_the_tokenizers_eos_stops_generation(model_with_tokenizer: str, tmp_path) -> None:
    """As vLLM: the tokenizer's eos stops a request even where config.json names another."""
    model = tmp_path / "m"
    shutil.copytree(model_with_tokenizer, model)
    llm = LLM(str(model), device="cpu", block_size=4, cpu_kv_tokens=512)
    ids = llm.generate([[5, 6, 7]], greedy(10), use_tqdm=False)[0].outputs[0].token_ids
    eos = ids[2]
    assert eos not in ids[:2] and 0 not in ids[:3]  # config.json's eos is 0
    tok_config = json.loads((model / "tokenizer_config.json").read_text())
    tok_config["eos_token"] = llm.tokenizer.convert_ids_to_tokens(eos)
    (model / "tokenizer_config.json").write_text(json.dumps(tok_config))
    out = LLM(str(model), device="cpu", block_size=4, cpu_kv_tokens=512).generate(
        [[5, 6, 7]], greedy(10), use_tqdm=False
    )
    assert out[0].outputs[0].finish_reason == "stop" and out[0].outputs[0].token_ids == ids[:3]


def test_a_stop_token_keeps_its_id_but_not_its_text(llm: LLM) -> None:
    tok = llm.tokenizer
    ids = llm.generate([[5, 6, 7]], greedy(10, ignore_eos=True), use_tqdm=False)[0].outputs[0].token_ids
    stop_at = ids[3]
    assert stop_at not in ids[:3] and tok.decode([stop_at]) != ""
    out = llm.generate([[5, 6, 7]], greedy(10, stop_token_ids=[stop_at]), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids == ids[:4] and out.stop_reason == stop_at
    assert out.text == tok.decode(ids[:3], skip_special_tokens=True)


def test_include_stop_str_in_output_keeps_a_stop_tokens_text(llm: LLM) -> None:
    """As vLLM v1's detokenizer: a sequence that a stop token id ends decodes that token too where
    `include_stop_str_in_output` is set (it skips it only otherwise)."""
    tok = llm.tokenizer
    ids = llm.generate([[5, 6, 7]], greedy(10, ignore_eos=True), use_tqdm=False)[0].outputs[0].token_ids
    stop_at = ids[3]
    assert stop_at not in ids[:3] and tok.decode([stop_at]) != ""
    params = greedy(10, stop_token_ids=[stop_at], include_stop_str_in_output=True)
    out = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids == ids[:4] and out.stop_reason == stop_at
    assert out.text == tok.decode(ids[:4], skip_special_tokens=True)


def test_stop_reason_names_the_stop_string(llm: LLM) -> None:
    text = llm.generate([[5, 6, 7]], greedy(10, ignore_eos=True), use_tqdm=False)[0].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip()
    out = llm.generate([[5, 6, 7]], greedy(10, ignore_eos=True, stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop and out.text == text[: text.find(stop)]
    length = llm.generate([[5, 6, 7]], greedy(3, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert length.finish_reason == "length" and length.stop_reason is None


def test_the_engine_seed_fixes_unseeded_sampling(model_with_tokenizer: str) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)

    def run(seed: int, global_seed: int) -> list[int]:
        torch.manual_seed(global_seed)  # the global generator must not be what decides
        llm = LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=512, seed=seed)
        return llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0].token_ids

    assert run(0, 1) == run(0, 2)
    assert run(0, 1) != run(1, 1)


def stream_texts(llm: LLM, params: SamplingParams) -> list[str]:
    """The text of each output `LLMEngine.step()` gives for one request, in order."""
    engine = llm.engine
    rid = engine.add_request([5, 6, 7], params)
    texts = []
    while engine.has_unfinished_requests():
        texts += [o.outputs[0].text for o in engine.step() if o.request_id == rid]
    return texts


def test_streamed_text_never_takes_back_the_start_of_a_stop_string(llm: LLM) -> None:
    """As vLLM: while a sequence runs, its text holds back the characters that could still begin a stop
    string, so each output's text extends the one before (it once showed a stop string's first characters,
    then cut them)."""
    free = stream_texts(llm, greedy(16, ignore_eos=True))
    text = free[-1]
    # A stop string whose first two characters arrive one step before its third, found first there.
    stop, cut = next(
        (t[-2:] + text[len(t)], len(t) - 2)
        for t, before in zip(free[1:], free)
        if len(t) - len(before) >= 2 and len(t) < len(text) and text.find(t[-2:] + text[len(t)]) == len(t) - 2
    )
    texts = stream_texts(llm, greedy(16, ignore_eos=True, stop=[stop]))
    assert texts[-1] == text[:cut]
    for before, after in zip(texts, texts[1:]):
        assert after.startswith(before), (stop, texts)


def test_numpy_scalars_are_accepted_where_vllm_takes_them(llm: LLM) -> None:
    params = SamplingParams(
        temperature=np.float32(0.0),
        top_k=np.int64(5),
        max_tokens=np.int32(4),
        seed=np.uint64(7),
        n=np.int8(1),
        stop_token_ids=[np.int64(3)],
        ignore_eos=True,
    )
    assert (
        type(params.max_tokens) is int and type(params.seed) is int and type(params.stop_token_ids[0]) is int
    )
    assert type(params.temperature) is float
    want = llm.generate([[5, 6, 7]], greedy(4, ignore_eos=True, stop_token_ids=[3]), use_tqdm=False)[0]
    got = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids


@pytest.mark.parametrize("shape", [tuple, np.array, lambda ids: [np.int64(i) for i in ids]])
def test_a_single_prompt_of_ids_in_any_sequence_is_one_prompt(llm: LLM, shape) -> None:
    want = llm.generate([[5, 6, 7]], greedy(), use_tqdm=False)[0]
    got = llm.generate(shape([5, 6, 7]), greedy(), use_tqdm=False)
    assert len(got) == 1 and got[0].prompt_token_ids == [5, 6, 7]
    assert got[0].outputs[0].token_ids == want.outputs[0].token_ids


def test_max_tokens_none_runs_to_the_context_limit(model_with_tokenizer: str) -> None:
    llm = LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=2048, max_model_len=24)
    out = llm.generate(
        [[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True), use_tqdm=False
    )
    assert len(out[0].outputs[0].token_ids) == 24 - 3 and out[0].outputs[0].finish_reason == "length"
    assert_serving(llm)


def test_max_tokens_none_is_capped_by_a_kv_cache_smaller_than_the_context(model_with_tokenizer: str) -> None:
    llm = LLM(model_with_tokenizer, device="cpu", block_size=4, num_kv_blocks=8, max_model_len=64)
    out = llm.generate(
        [[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True), use_tqdm=False
    )
    assert len(out[0].outputs[0].token_ids) == 8 * 4 - 3


def test_include_stop_str_in_output_keeps_the_stop_string(llm: LLM) -> None:
    text = llm.generate([[5, 6, 7]], greedy(10, ignore_eos=True), use_tqdm=False)[0].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    kept = greedy(10, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)
    out = llm.generate([[5, 6, 7]], kept, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.find(stop) + len(stop)]


def test_a_callers_edit_of_prompt_token_ids_does_not_reach_the_engine(llm: LLM) -> None:
    """As vLLM's, a request's outputs share one list of prompt ids: the engine's own is never handed out."""
    engine = llm.engine
    rid = engine.add_request([5, 6, 7], greedy(8, ignore_eos=True))
    req = engine.groups[rid].root
    outputs = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == rid:
                out.prompt_token_ids.append(99)  # the caller's copy
                outputs.append(out)
    assert len(outputs) >= 2 and all(o.prompt_token_ids is outputs[0].prompt_token_ids for o in outputs)
    assert outputs[0].prompt_token_ids == [5, 6, 7] + [99] * len(outputs)
    assert req.prompt_token_ids == [5, 6, 7] and req.all_token_ids[:4] == [5, 6, 7, req.output_token_ids[0]]


def test_vllms_argument_order_names_the_same_request(llm: LLM) -> None:
    """`add_request(request_id, prompt, params)`, as vLLM's engine takes it, queues the request under that id with
    that prompt and params, as roseinfer's own order does."""
    engine, rng = llm.engine, np.random.default_rng()
    prompt = rng.integers(5, 60, size=int(rng.integers(3, 9))).tolist()
    params = greedy(int(rng.integers(2, 6)), ignore_eos=True)

    def run(rid: str) -> list[int]:
        out: list[int] = []
        while engine.has_unfinished_requests():
            out = next((list(o.outputs[0].token_ids) for o in engine.step() if o.request_id == rid), out)
        return out  # the last (cumulative) output's

    assert engine.add_request(prompt, params, "ours") == "ours"
    want = run("ours")
    assert engine.add_request("vllms", prompt, params) == "vllms"
    req = engine.groups["vllms"].root
    assert req.prompt_token_ids == prompt and req.params.max_tokens == params.max_tokens
    assert run("vllms") == want and len(want) == params.max_tokens
    with pytest.raises(ValueError, match="SamplingParams"):  # neither order: still refused by name
        engine.add_request("a", "b", "c")  # type: ignore[arg-type]
    assert_serving(llm)
