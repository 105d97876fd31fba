"""Requests the scheduler once could never admit again (no model): each test failed before its fix."""

from __future__ import annotations

from roseinfer.config import SchedulerConfig
from roseinfer.kv.manager import KVCacheManager
from roseinfer.request import Request
from roseinfer.sampling_params import SamplingParams
from roseinfer.scheduler.scheduler import Scheduler


def run(sched: Scheduler, arrivals: dict[int, Request], steps: int = 100) -> None:
    """Step until every request is done, each sampling token 30; every step must schedule something."""
    for i in range(steps):
        if i in arrivals:
            sched.add_request(arrivals[i])
        if not sched.has_unfinished():
            if i > max(arrivals):
                return
            continue
        out = sched.schedule()
        assert not out.is_empty, f"step {i}: no progress; waiting={list(sched.waiting)}"
        sched.update_from_output(out, [[30] * s.num_samples for s in out.scheduled])
        sched.check_invariants()
    raise AssertionError("did not finish")


def test_a_preempted_recompute_longer_than_the_budget_runs_without_chunked_prefill() -> None:
    kv = KVCacheManager(5, 4, enable_prefix_caching=False)  # 20 slots
    sched = Scheduler(SchedulerConfig(8, 8, "continuous", enable_chunked_prefill=False), kv, 10_000)
    b = Request("b", list(range(20, 24)), SamplingParams(max_tokens=12))  # 16 slots
    a = Request("a", list(range(10, 17)), SamplingParams(max_tokens=8))  # a 7-token prompt fits the budget
    run(sched, {0: b, 1: a})  # a is preempted with 4 outputs: 11 tokens to recompute, over the budget of 8
    assert sched.num_preemptions >= 1
    assert len(a.output_token_ids) == 8 and len(b.output_token_ids) == 12
    assert kv.num_free_blocks == 5


def test_a_prompt_whose_own_cached_blocks_fill_the_pool_runs_again() -> None:
    kv = KVCacheManager(2, 4)  # 8 slots: a 5-token prompt + 3 tokens fills them exactly
    sched = Scheduler(SchedulerConfig(8, 64), kv, 10_000)
    a = Request("a", [20, 21, 22, 23, 24], SamplingParams(max_tokens=3))
    b = Request("b", [20, 21, 22, 23, 24], SamplingParams(max_tokens=3))
    # b's hit covers both cached blocks; writing into the partial one would need a copy and a third block.
    run(sched, {0: a, 10: b})
    assert len(b.output_token_ids) == 3
    assert kv.num_free_blocks == 2


def test_a_request_filling_the_pool_writes_its_own_partial_prompt_block_under_a_small_budget() -> None:
    """2 blocks of 4, budget 1: the 5-token prompt's partial block is registered once its last token is
    computed; the request holds it alone but copied it before each write, with no block free for the copy.
    It preempted itself, recomputed the prompt's end one token a step (registering the block again), and
    never got past it."""
    kv = KVCacheManager(2, 4)
    sched = Scheduler(SchedulerConfig(8, 1, "continuous"), kv, 10_000)
    a = Request("a", [20, 21, 22, 23, 24], SamplingParams(max_tokens=3))
    run(sched, {0: a})
    assert len(a.output_token_ids) == 3
    assert sched.num_preemptions == 0
    assert kv.num_free_blocks == 2
