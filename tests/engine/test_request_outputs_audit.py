"""How a request's outputs are assembled (roseinfer/engine/request_outputs.py), beyond the engine tests (gaps
the mutation audit found): a stop token id's text is kept only with include_stop_str_in_output, as vLLM's."""

from __future__ import annotations

import random

import pytest

from roseinfer import LLM, SamplingParams
from tests.engine.test_min_tokens import prefer


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_token_ids_text_is_kept_only_when_asked(model_with_tokenizer, include: bool) -> None:
    llm = LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=256)
    rng = random.Random(include)
    words = [" world", " hello", " the", " and"]
    token = llm.tokenizer.encode(rng.choice(words), add_special_tokens=False)[0]
    assert token not in llm.engine.eos_token_ids
    prefer(llm, token)
    params = SamplingParams(
        temperature=0.0, max_tokens=4, stop_token_ids=[token], include_stop_str_in_output=include
    )
    out = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0]
    assert (out.token_ids, out.finish_reason, out.stop_reason) == ([token], "stop", token)
    assert out.text == (llm.tokenizer.decode([token]) if include else "")


@pytest.mark.parametrize("min_tokens", [1, 2, 3])
def test_no_stop_string_ends_the_first_min_tokens_tokens(model_with_tokenizer, min_tokens: int) -> None:
    """As vLLM's detokenizer: stop strings are searched only once the output is longer than min_tokens, so a
    stop string each token completes ends the text at token min_tokens + 1, before that token's text."""
    llm = LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=256)
    token = llm.tokenizer.encode(" world", add_special_tokens=False)[0]
    prefer(llm, token)
    stop = llm.tokenizer.decode([token])
    params = SamplingParams(
        temperature=0.0, max_tokens=8, min_tokens=min_tokens, ignore_eos=True, stop=[stop]
    )
    out = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.token_ids == [token] * (min_tokens + 1)
    assert out.text == llm.tokenizer.decode([token] * min_tokens)
