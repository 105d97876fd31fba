"""A request that asks for logprobs takes each token with the sampler's entry for exactly that token."""

from __future__ import annotations

import pytest

from roseinfer.logprobs import TokenLogprobs
from roseinfer.request import Request
from roseinfer.sampling_params import SamplingParams


def test_a_token_must_come_with_its_own_logprobs() -> None:
    req = Request("a", [1, 2], SamplingParams(max_tokens=4, logprobs=1))
    req.append_token(5, TokenLogprobs([5, 5], [-0.5, -0.5], 1))
    with pytest.raises(RuntimeError, match="logprobs"):
        req.append_token(6, TokenLogprobs([7, 6], [-0.1, -0.1], 2))  # another token's entry
    with pytest.raises(RuntimeError, match="logprobs"):
        req.append_token(6)


def test_dropped_tokens_take_their_logprobs_with_them() -> None:
    req = Request("a", [1, 2], SamplingParams(max_tokens=4, logprobs=0))
    for token, lp in ((5, -0.25), (6, -0.5), (7, -1.0)):
        req.append_token(token, TokenLogprobs([token], [lp], 1))
    req.drop_last_tokens(2)
    assert req.output_token_ids == [5] and req.all_token_ids == [1, 2, 5]
    assert req.logprobs == [TokenLogprobs([5], [-0.25], 1)] and req.cumulative_logprob == -0.25
    req.drop_last_tokens(0)
    assert req.output_token_ids == [5] and req.cumulative_logprob == -0.25
