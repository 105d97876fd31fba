"""lof end to end: the same greedy tokens as fcfs, admitted longest max_tokens first, nothing left over."""

from __future__ import annotations

import random

from roseinfer import LLM, SamplingParams
from tests.engine.test_async_fuzz_modes import assert_clean


def test_lof_with_a_small_budget_matches_fcfs_and_admits_longest_first(llama_dir):
    rng = random.Random(3)
    prompts = [[rng.randint(5, 90) for _ in range(rng.randint(1, 14))] for _ in range(7)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (2, 9, 4, 12, 1, 9, 6)]
    outs = {}
    for policy, budget in (("fcfs", 64), ("lof", 5)):
        for async_ in (False, True):
            llm = LLM(
                llama_dir,
                device="cpu",
                dtype="float32",
                block_size=4,
                cpu_kv_tokens=2048,
                max_num_batched_tokens=budget,
                admission_policy=policy,
                async_scheduling=async_,
            )
            assert llm.engine.core.scheduler.policy.name == policy
            res = llm.generate(prompts, params, use_tqdm=False)
            outs[policy, async_] = [o.outputs[0].token_ids for o in res]
            assert_clean(llm)
            if policy == "lof":
                # a 5-token budget admits one prompt (or a chunk of one) a step: first tokens come
                # out in admission order, longest max_tokens first, ties in arrival order
                first = sorted(range(7), key=lambda i: res[i].metrics.first_token_time)
                assert first == sorted(range(7), key=lambda i: (-params[i].max_tokens, i))
    assert len({tuple(map(tuple, v)) for v in outs.values()}) == 1
