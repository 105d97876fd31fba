"""Mutation audit (runner/step_future.py): a step's tokens come back as one list per scheduled request, empty for
each request that sampled nothing, including a step where no request sampled at all."""

from __future__ import annotations

import torch

from roseinfer.runner.step_future import StepFuture


def test_a_step_where_no_request_sampled_gives_each_an_empty_list():
    future = StepFuture(3, [], None, None)
    assert future.result() == [[], [], []]
    assert future.logprobs() is None and future.prompt_logprobs() == []


def test_tokens_are_grouped_by_their_scheduled_request():
    tokens = torch.tensor([7, 8, 9], dtype=torch.int32)
    assert StepFuture(4, [1, 1, 3], tokens, None).result() == [[], [7, 8], [], [9]]
    assert StepFuture(3, [0, 1, 2], tokens, None, one_each=True).result() == [[7], [8], [9]]
