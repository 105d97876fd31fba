"""How a request's outputs are assembled (roseinfer/engine/request_outputs.py), beyond the engine tests (gaps
the mutation audit found), as vLLM's: a stop token id's or stop string's text kept only with
include_stop_str_in_output; no stop string ending the first min_tokens tokens; a stop string straddling two tokens;
streamed text held back only without include_stop_str_in_output; a FINAL_ONLY n > 1 output's finished_time is its
last sample's; each streamed output's prompt logprobs a list of its own."""

from __future__ import annotations

import random
import time

import pytest

from roseinfer import LLM, SamplingParams
from roseinfer.sampling_params import RequestOutputKind
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


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("word", [" world", " hello"])
def test_a_stop_string_straddling_two_tokens_ends_the_text(
    model_with_tokenizer, word: str, include: bool
) -> None:
    """A stop string made of one token's last character and the next one's first: found when the second token
    comes, though most of it lies in text already searched; the text ends before it, or (include_stop_str_in_output)
    after it."""
    llm = LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=256)
    token = llm.tokenizer.encode(word, add_special_tokens=False)[0]
    prefer(llm, token)
    piece = llm.tokenizer.decode([token])
    stop = piece[-1] + piece[:2]
    params = SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True, stop=[stop], include_stop_str_in_output=include
    )
    out = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0]
    whole = llm.tokenizer.decode([token] * 2)
    assert stop not in piece and whole.find(stop) >= 0
    assert (out.finish_reason, out.stop_reason, out.token_ids) == ("stop", stop, [token] * 2)
    assert out.text == whole[: whole.find(stop) + (len(stop) if include else 0)]


@pytest.mark.parametrize("include", [False, True])
def test_streamed_text_is_held_back_only_without_include_stop_str(
    model_with_tokenizer, include: bool
) -> None:
    """As vLLM's detokenizer: a running sample's streamed text leaves out the last len(longest stop) - 1
    characters, which could begin a stop string, unless include_stop_str_in_output (nothing is cut then)."""
    llm = LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=256)
    never = "\u2603\u2603\u2603\u2603"  # never written: it only makes text wait
    params = SamplingParams(
        temperature=0.0,
        max_tokens=16,
        ignore_eos=True,
        stop=["\u2603", never],
        include_stop_str_in_output=include,
        output_kind=RequestOutputKind.CUMULATIVE,
    )
    engine = llm.engine
    engine.add_request([5, 6, 7], params)
    seen = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            (c,) = out.outputs
            whole = llm.tokenizer.decode(c.token_ids)
            if "\ufffd" in whole:
                continue
            held = 0 if include or out.finished else len(never) - 1
            assert c.text == whole[: max(len(whole) - held, 0)]
            seen += 1
    assert seen >= 3  # the final output and some running ones


def test_a_final_only_groups_finished_time_is_its_last_samples(model_with_tokenizer) -> None:
    """n > 1, FINAL_ONLY: the one output's finished_time is when its last sample ended (in the step that made
    the output), though the first sample ended steps before."""
    llm = LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=512)
    engine = llm.engine
    vocab = engine.model_config.vocab_size
    stops = list(range(0, vocab, 3))  # a third of the vocabulary ends a sample: lengths vary
    params = SamplingParams(
        n=4,
        temperature=1.0,
        seed=3,
        max_tokens=12,
        ignore_eos=True,
        stop_token_ids=stops,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    engine.add_request([5, 6, 7], params)
    outs: list = []
    started = 0.0
    while not outs:
        started = time.monotonic()
        outs = engine.step()
    (out,) = outs
    lengths = [len(c.token_ids) for c in out.outputs]
    assert lengths[0] < max(lengths), lengths  # the first sample (the request itself) ended early
    assert out.metrics.finished_time is not None and out.metrics.finished_time >= started


def test_each_streamed_output_has_prompt_logprobs_of_its_own(model_with_tokenizer) -> None:
    """CUMULATIVE n > 1: every output carries the prompt logprobs (None first, one entry a prompt token), a list
    the caller may change without changing the next output's."""
    llm = LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=512)
    engine = llm.engine
    prompt = [5, 6, 7, 8]
    params = SamplingParams(
        n=2,
        temperature=1.0,
        seed=5,
        max_tokens=4,
        ignore_eos=True,
        prompt_logprobs=1,
        output_kind=RequestOutputKind.CUMULATIVE,
    )
    engine.add_request(prompt, params)
    seen = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            got = out.prompt_logprobs
            assert got is not None and len(got) == len(prompt) and got[0] is None
            assert all(prompt[i] in got[i] for i in range(1, len(prompt)))
            got.clear()  # the caller's list
            seen += 1
    assert seen == 2 * 4
