"""Fix: a boolean is not a count. SamplingParams refused True for min_tokens, logprobs, the penalties and the
token ids, but took n=True, max_tokens=True, top_k=True and seed=True as 1 (bool is an int subclass): a
caller's mix-up of fields ran as a request instead of a ValueError naming the field."""

from __future__ import annotations

import pytest

from roseinfer import SamplingParams


@pytest.mark.parametrize(
    "name", ["n", "max_tokens", "top_k", "seed", "min_tokens", "logprobs", "prompt_logprobs"]
)
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_not_a_count(name, value):
    with pytest.raises(ValueError, match=name):
        SamplingParams(temperature=1.0, **{name: value})
