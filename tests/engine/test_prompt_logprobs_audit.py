"""Mutation audit (runner/prompt_logprobs.py): requests asking for different numbers of prompt logprobs in one
step each get their own number (the step computes the most any asks for, and each keeps its own), against the
whole-prompt reference of `test_prompt_logprobs.py`."""

from __future__ import annotations

import pytest

from roseinfer import SamplingParams
from tests.engine.test_min_tokens import make
from tests.engine.test_prompt_logprobs import check_prompt, generate

PROMPTS = [[40 + i for i in range(7)], [60 + i for i in range(5)], [80 + i for i in range(6)]]


@pytest.mark.parametrize("ks", [(5, 1, 0), (0, 1, 5), (1, 5, 2)])
def test_each_request_of_a_step_gets_its_own_number(llama_dir, ks):
    llm = make(llama_dir, async_scheduling=False)
    params = [SamplingParams(max_tokens=1, prompt_logprobs=k) for k in ks]
    outs = generate(llm, PROMPTS, params)
    for prompt, out, k in zip(PROMPTS, outs, ks):
        check_prompt(llm, prompt, out.prompt_logprobs, k)
