"""Front-door checks (`LLMEngine.validate`) at their exact limits, which the mutation audit found untested: each
bad request gets a ValueError naming what is wrong while the others run; a request exactly at a limit runs."""

from __future__ import annotations

import pytest

from roseinfer import LLM, InvalidRequestError, SamplingParams
from tests.engine.test_min_tokens import make

VOCAB = 384  # the tiny llama's
CONTEXT = 512  # its max_position_embeddings


def test_the_first_id_past_the_vocabulary_is_refused(llm: LLM) -> None:
    vocab = llm.engine.model_config.vocab_size
    with pytest.raises(
        InvalidRequestError, match=rf"prompt token id {vocab} at position 1 is outside"
    ) as info:
        llm.generate([[1, vocab], [1, vocab - 1]], SamplingParams(max_tokens=2), use_tqdm=False)
    assert list(info.value.errors) == [0] and len(info.value.outputs[1].outputs[0].token_ids) == 2


def test_a_prompt_as_long_as_the_context_is_refused_by_its_length(llama_dir) -> None:
    llm = make(llama_dir, num_kv_blocks=160)
    with pytest.raises(
        InvalidRequestError, match=f"prompt has {CONTEXT} tokens; the model context is {CONTEXT}"
    ):
        llm.generate([[5] * CONTEXT], SamplingParams(max_tokens=None), use_tqdm=False)


def test_stop_strings_without_a_tokenizer_are_refused_alone(llama_dir) -> None:
    llm = make(llama_dir)
    assert llm.tokenizer is None
    params = [SamplingParams(max_tokens=2, stop=["x"]), SamplingParams(max_tokens=2, stop_token_ids=[3])]
    with pytest.raises(InvalidRequestError, match="stop strings need a tokenizer") as info:
        llm.generate([[5, 6], [5, 6]], params, use_tqdm=False)
    assert list(info.value.errors) == [0] and info.value.outputs[1] is not None


def test_without_chunked_prefill_a_prompt_of_exactly_the_budget_runs(llama_dir) -> None:
    llm = make(llama_dir, enable_chunked_prefill=False, max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    with pytest.raises(InvalidRequestError, match="max_num_batched_tokens") as info:
        llm.generate([list(range(10, 26)), list(range(10, 27))], params, use_tqdm=False)
    assert list(info.value.errors) == [1]
    assert len(info.value.outputs[0].outputs[0].token_ids) == 2


def test_booleans_are_not_token_ids(llm: LLM) -> None:
    with pytest.raises(
        InvalidRequestError, match="prompt token id True at position 1 is not an integer \\(bool\\)"
    ):
        llm.generate([[5, True, 7]], SamplingParams(max_tokens=2), use_tqdm=False)
