"""Mutation audit (runner/sampler_profile.py): start-up sizing asks for no more logprobs than the vocabulary has,
whatever max_logprobs allows (-1 or a cap past the vocabulary)."""

from __future__ import annotations

import pytest
import torch

from roseinfer.runner.sampler_profile import WorstCaseSampling, logprobs_cap

VOCAB = 64


@pytest.mark.parametrize(("max_logprobs", "want"), [(5, 5), (VOCAB, VOCAB), (VOCAB + 36, VOCAB), (-1, VOCAB)])
def test_the_worst_case_asks_for_at_most_the_vocabulary(max_logprobs: int, want: int) -> None:
    assert logprobs_cap(max_logprobs, VOCAB) == want
    worst = WorstCaseSampling.build(4, VOCAB, torch.device("cpu"), max_logprobs, prompt_rows=8)
    assert worst.batch.num_logprobs == want and worst.prompt_job.k == want
