"""Mutation audit (sampling_params.py): the validation limits at their exact edges and the normalisations a
caller sees (a str where a list is meant, JSON's string keys, numpy scalars, booleans that are not numbers).
Each bad value is a ValueError naming its field."""

from __future__ import annotations

import numpy as np
import pytest

from roseinfer import SamplingParams


def test_a_single_stop_string_is_one_stop_string_and_an_empty_one_is_refused():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=None).stop == []
    for bad in ([""], ["ok", ""], [3]):
        with pytest.raises(ValueError, match="stop must hold non-empty strings"):
            SamplingParams(stop=bad)


def test_a_single_bad_word_string_is_one_word_and_blank_words_are_refused():
    assert SamplingParams(bad_words="two words").bad_words == ["two words"]
    assert SamplingParams(bad_words=[]).bad_words is None
    for bad in (["   "], ["ok", "\t\n"], "  "):
        with pytest.raises(ValueError, match="bad_words must hold non-blank strings"):
            SamplingParams(bad_words=bad)


def test_logit_bias_keys_as_json_strings_and_their_edges():
    """vLLM's OpenAI server sends string keys; each names the id it spells (surrounding spaces as int() takes
    them). Id 0 is a token; -1 is not, as an int or a string."""
    sp = SamplingParams(logit_bias={" 50 ": 1, "0": -2.5})
    assert sp.logit_bias == {50: 1.0, 0: -2.5} and all(type(k) is int for k in sp.logit_bias)
    assert SamplingParams(logit_bias={}).logit_bias is None  # nothing to add: no logit controls
    for key in (-1, "-1", "x", True):
        with pytest.raises(ValueError, match="logit_bias keys must be non-negative token ids"):
            SamplingParams(logit_bias={key: 1.0})


def test_truncate_prompt_tokens_takes_plain_ints_only():
    sp = SamplingParams(truncate_prompt_tokens=np.int64(3))
    assert sp.truncate_prompt_tokens == 3 and type(sp.truncate_prompt_tokens) is int
    assert SamplingParams(truncate_prompt_tokens=1).truncate_prompt_tokens == 1
    for bad in (True, False, 0, -2, 1.0):
        with pytest.raises(ValueError, match="truncate_prompt_tokens"):
            SamplingParams(truncate_prompt_tokens=bad)


def test_a_seed_must_be_an_int():
    for bad in ("3", 3.0):
        with pytest.raises(ValueError, match="seed must be an int"):
            SamplingParams(temperature=1.0, seed=bad)
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1 and SamplingParams(seed=-(2**63)).seed == -(2**63)


def test_the_edges_that_are_allowed():
    """min_p 1 (greedy among the top), top_k -1 and 0 (off), presence/frequency exactly +-2, logprobs -1, a
    repetition penalty just above 0, temperature 0."""
    for kw in (
        dict(min_p=1.0),
        dict(min_p=0.0),
        dict(top_k=-1),
        dict(top_k=0),
        dict(presence_penalty=2.0, frequency_penalty=-2.0),
        dict(presence_penalty=-2.0, frequency_penalty=2.0),
        dict(logprobs=-1, prompt_logprobs=-1),
        dict(logprobs=0, prompt_logprobs=0),
        dict(repetition_penalty=1e-6),
        dict(temperature=0.0),
        dict(max_tokens=1),
        dict(n=1),
    ):
        sp = SamplingParams(**kw)
        assert all(getattr(sp, k) == v for k, v in kw.items()), kw
    for kw, field in ((dict(logprobs=-2), "logprobs"), (dict(prompt_logprobs=-2), "prompt_logprobs")):
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kw)
