"""Async vs sync on many small configurations (greedy, seeded, stops, min_tokens, penalties, n > 1, tiny pools,
modes)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from roseinfer import LLM, SamplingParams
from tests.engine.engine_fuzz import with_penalties


def token_ids(outs):
    return [[(c.token_ids, c.finish_reason) for c in o.outputs] for o in outs]


def assert_clean(llm: LLM) -> None:
    core = llm.engine.core
    assert not core.has_unfinished() and core.inflight is None
    core.scheduler.check_invariants()
    assert core.kv.num_free_blocks == core.kv.num_blocks - len(core.kv.pool.pinned)
    assert not core.runner.sampling.generators, core.runner.sampling.generators
    assert core.runner.sampling.penalty_table is None or not core.runner.sampling.penalty_table.slot_of


def case(seed: int):
    rng = random.Random(seed)
    kw = dict(
        cpu_kv_tokens=rng.choice([48, 64, 96, 2048]),
        max_num_batched_tokens=rng.choice([3, 8, 64]),
        max_num_seqs=rng.choice([1, 2, 4, 8]),
        scheduler_mode=rng.choice(["continuous", "continuous", "static", "naive"]),
        enable_prefix_caching=rng.random() < 0.7,
        admission_policy=rng.choice(["fcfs", "lpm", "lof"]),
    )
    shared = [rng.randint(5, 90) for _ in range(rng.choice([0, 4, 9]))]
    prompts, params = [], []
    for i in range(rng.randint(2, 7)):
        p = shared + [rng.randint(5, 90) for _ in range(rng.randint(1, 12))]
        prompts.append(p)
        mt = rng.randint(1, 10)
        kind = rng.random()
        if kind < 0.5:
            sp = SamplingParams(temperature=0.0, max_tokens=mt, ignore_eos=True)
        elif kind < 0.8:
            sp = SamplingParams(
                temperature=1.0,
                max_tokens=mt,
                seed=i,
                n=min(rng.choice([1, 2, 3]), kw["max_num_seqs"]),
                ignore_eos=True,
            )
        else:
            sp = SamplingParams(temperature=0.0, max_tokens=mt, stop_token_ids=[rng.randint(0, 127)])
        # From a stream of its own, so that the cases' other draws stay as they were: half the vocabulary
        # as stop ids, held off by a min_tokens that async scheduling must count as the sync loop does.
        extra = random.Random(seed * 1_000_003 + i)
        if extra.random() < 0.4:
            stops = sp.stop_token_ids + list(range(extra.randint(0, 1), 384, 2))
            sp = replace(sp, stop_token_ids=stops, min_tokens=extra.randint(0, mt))
        # Penalties, counted alike with a token in flight or not (a stream of their own too).
        sp = with_penalties(sp, random.Random(seed * 7_000_003 + i))
        params.append(sp)
    return kw, prompts, params


@pytest.mark.parametrize("seed", range(30))
def test_fuzz(llama_dir, seed):
    kw, prompts, params = case(seed)
    res = []
    for a in (False, True):
        llm = LLM(llama_dir, device="cpu", dtype="float32", block_size=4, async_scheduling=a, **kw)
        res.append(token_ids(llm.generate(prompts, params, use_tqdm=False)))
        assert_clean(llm)
    assert res[0] == res[1], kw
