"""Request bookkeeping asked for on every step."""

from __future__ import annotations

from roseinfer.request import Request, RequestStatus
from roseinfer.sampling_params import SamplingParams


def test_exactly_the_terminal_statuses_are_finished() -> None:
    terminal = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED}
    assert {s for s in RequestStatus if s.finished} == terminal


def test_length_limit_counts_pending_tokens() -> None:
    req = Request("a", [1, 2, 3], SamplingParams(max_tokens=2))
    assert not req.reached_length_limit(max_model_len=10)
    req.append_token(4)
    req.num_pending = 1  # the second output token is in flight
    assert req.reached_length_limit(max_model_len=10)
    req.num_pending = 0
    assert not req.reached_length_limit(max_model_len=10)
    assert req.reached_length_limit(max_model_len=4)  # 3 prompt + 1 output tokens fill the context
