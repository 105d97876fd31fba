"""Every bad input: a ValueError naming the field and limit, before scheduling; the engine keeps serving."""

from __future__ import annotations

import math

import pytest

from roseinfer import InvalidRequestError, SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -2}, "top_k must be -1"),
        ({"min_p": 2.0}, r"min_p must be in \[0, 1\]"),
        ({"temperature": math.nan}, "temperature must be a finite number"),
        ({"top_p": math.nan}, "top_p must be a finite number"),
        ({"min_p": math.nan}, "min_p must be a finite number"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"n": 0}, "n must be >= 1"),
    ],
)
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def good() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=4)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("", "prompt must not be empty"),
        ([], "prompt must not be empty"),
        ([1, 2, 10**9], r"prompt token id 1000000000 at position 2 is outside the vocabulary \[0, "),
        ([1, -3], "prompt token id -3 at position 1 is outside the vocabulary"),
        ([1, math.nan], "prompt token id at position 1 is NaN"),
        ([5] * 600, "prompt has 600 tokens; the model context is 512"),
        (3.5, "prompt must be a string or a list of token ids"),
        ([1, True], r"prompt token id True at position 1 is not an integer \(bool\)"),
        ([[1, 2]], r"prompt token id \[1, 2\] at position 0 is not an integer \(list\)"),
        ({"text": "hi"}, r"a dict prompt has key\(s\) \['text'\] this engine does not take"),
        ({"cache_salt": "s"}, "a dict prompt has neither 'prompt' nor 'prompt_token_ids'"),
        ({"prompt_token_ids": [5, 6], "multi_modal_data": {}}, r"key\(s\) \['multi_modal_data'\]"),
    ],
)
def test_bad_prompt_rejected_others_complete(llm, prompt, message):
    prompts = ["hello world", prompt, [5, 6, 7]]
    with pytest.raises(InvalidRequestError, match=message) as info:
        llm.generate(prompts, good(), use_tqdm=False)
    err = info.value
    assert isinstance(err, ValueError) and list(err.errors) == [1]
    assert err.outputs[1] is None
    assert all(err.outputs[i].finished and len(err.outputs[i].outputs[0].token_ids) == 4 for i in (0, 2))
    assert_engine_clean_and_serving(llm)


def test_prompt_plus_max_tokens_beyond_context(llm):
    with pytest.raises(ValueError, match=r"\+ max_tokens \(100\) exceeds the model context of 512"):
        llm.engine.add_request([5] * 450, SamplingParams(max_tokens=100))
    assert_engine_clean_and_serving(llm)


def test_request_larger_than_the_whole_pool(model_with_tokenizer):
    from roseinfer import LLM

    small = LLM(model_with_tokenizer, device="cpu", block_size=4, num_kv_blocks=8)
    with pytest.raises(ValueError, match=r"can never fit the KV cache of 32 tokens \(8 blocks\)"):
        small.engine.add_request([5] * 30, SamplingParams(max_tokens=8))
    assert_engine_clean_and_serving(small)


def test_bad_request_mid_stream_leaves_running_requests_alone(llm):
    engine = llm.engine
    rid = engine.add_request([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=6))
    engine.step()
    with pytest.raises(ValueError, match="top_p must be in"):
        engine.add_request([1, 2], SamplingParams(top_p=7.0))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request([1, 10**6], good())
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert list(finished) == [rid] and len(finished[rid].outputs[0].token_ids) == 6
    assert_engine_clean_and_serving(llm)


def test_wrong_params_type_and_count(llm):
    with pytest.raises(ValueError, match="got 2 prompts but 1 sampling params"):
        llm.generate([[1], [2]], [good()], use_tqdm=False)
    assert_engine_clean_and_serving(llm)


def assert_engine_clean_and_serving(llm) -> None:
    core = llm.engine.core
    core.scheduler.check_invariants()
    assert not core.has_unfinished()
    assert core.kv.num_free_blocks == core.kv.num_blocks
    out = llm.generate(["still serving"], good(), use_tqdm=False)[0]
    assert out.finished and len(out.outputs[0].token_ids) == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs must be in"),
        ({"max_num_seqs": 65_536}, r"max_num_seqs must be in \[1, 65535\]"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be >= 1"),
    ],
)
def test_scheduler_limits_are_checked_up_front(kwargs, message):
    from roseinfer.config import SchedulerConfig

    assert SchedulerConfig(max_num_seqs=65_535).max_num_seqs == 65_535  # the largest grid axis still fits
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**kwargs)
