"""Fix: a logit_bias key that looks numeric to str.isdigit but is no integer ("--5", "²") raised int()'s bare
"invalid literal" ValueError, naming neither logit_bias nor the key; now it is refused by name like any other
key that is not a token id."""

from __future__ import annotations

import pytest

from roseinfer import SamplingParams


@pytest.mark.parametrize("key", ["--5", "²", "-+5", "5-"])
def test_a_key_that_is_no_integer_is_refused_by_name(key):
    with pytest.raises(ValueError, match=r"logit_bias keys must be non-negative token ids, got '"):
        SamplingParams(logit_bias={key: 1.0})


def test_string_keys_that_are_integers_still_name_their_id():
    assert SamplingParams(logit_bias={"5": 1.0, " 7": 2.0, "+3": 0.5}).logit_bias == {5: 1.0, 7: 2.0, 3: 0.5}
