"""Scheduler + block pool under random arrivals, lengths, finishes and forced preemptions (no model)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from roseinfer.config import SchedulerConfig
from roseinfer.kv.manager import KVCacheManager
from roseinfer.request import Request, RequestStatus
from roseinfer.runner.inputs import block_table_array, build_host_step
from roseinfer.sampling_params import SamplingParams
from roseinfer.scheduler.policy import AdmissionPolicy
from roseinfer.scheduler.scheduler import Scheduler, SchedulerOutput
from tests.scheduler.driver import Driver


def run_random_stream(
    seed: int, mode: str = "continuous", async_: bool = False, policy: AdmissionPolicy | None = None
) -> Scheduler:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    num_blocks = rng.randint(8, 64)
    budget = rng.choice([4, 16, 64, 1024])
    kv = KVCacheManager(num_blocks, block_size)
    sched = Scheduler(SchedulerConfig(rng.randint(1, 8), budget, mode), kv, 10_000, policy)
    driver = Driver(sched, async_)
    pool_tokens = num_blocks * block_size
    all_reqs: list[Request] = []
    next_id = 0
    empty_in_a_row = 0
    fed_pending = 0  # requests scheduled while their previous token was still pending

    def check_scheduled(out: SchedulerOutput) -> None:
        nonlocal fed_pending
        assert out.num_tokens <= budget
        assert len({id(s.request) for s in out.scheduled}) == len(out.scheduled)
        for s in out.scheduled:
            r = s.request
            assert r.status == RequestStatus.RUNNING and s.num_new_tokens >= 1
            assert len(r.block_ids) * block_size >= s.start + s.num_new_tokens
            assert r.num_pending <= 2
            fed_pending += r.num_pending - (s.num_samples > 0) > 0
        if out.scheduled:  # the step's block table, gathered from the KV manager's mirror, is the lists'
            assert out.tables is kv.tables
            want = block_table_array([s.request.block_ids for s in out.scheduled])
            np.testing.assert_array_equal(build_host_step(out, block_size).block_tables, want)

    for _step in range(400):
        if rng.random() < 0.3 and next_id < 40:
            # As the front door: prompt + max_tokens fits the pool (else it could never run again once preempted).
            max_tokens = min(rng.randint(1, 12), pool_tokens - 1)
            prompt_len = rng.randint(1, max(1, min(40, pool_tokens - max_tokens)))
            params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[7] if rng.random() < 0.3 else [])
            req = Request(str(next_id), [rng.randint(10, 99) for _ in range(prompt_len)], params)
            next_id += 1
            all_reqs.append(req)
            sched.add_request(req)
        if not driver.has_unfinished():
            continue
        out = driver.step(lambda: rng.choice([7, 11, 12, 13]), check_scheduled)
        empty_in_a_row = empty_in_a_row + 1 if out.is_empty else 0
        assert empty_in_a_row < 2, "scheduler stalled"
        sched.check_invariants()
        if rng.random() < 0.05 and sched.running:  # an abort from outside
            sched.finish(rng.choice(sched.running), RequestStatus.FINISHED_ABORTED)
        if rng.random() < 0.05 and sched.running:  # a forced preemption
            sched._preempt(rng.choice(sched.running))
        sched.check_invariants()
    while driver.has_unfinished():
        out = driver.step(lambda: 11, check_scheduled)
        empty_in_a_row = empty_in_a_row + 1 if out.is_empty else 0
        assert empty_in_a_row < 2, "scheduler stalled"
        sched.check_invariants()
    for r in all_reqs:
        assert r.is_finished and not r.block_ids and r.num_pending == 0
        if r.status == RequestStatus.FINISHED_LENGTH:
            assert r.num_output_tokens == r.params.max_tokens
        if r.status == RequestStatus.FINISHED_STOPPED:
            assert r.output_token_ids.index(7) == len(r.output_token_ids) - 1
    assert kv.num_free_blocks == num_blocks
    assert kv.tables.rows_in_use == 0 and not kv.tables.array.any()
    if async_ and mode == "continuous":
        assert fed_pending > 0
    if not async_:
        assert fed_pending == 0
    return sched


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seed", range(40))
def test_random_streams_keep_invariants(seed, async_):
    run_random_stream(seed, async_=async_)


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seed", range(12))
def test_random_streams_keep_invariants_longest_output_first(seed, async_):
    run_random_stream(seed, async_=async_, policy=AdmissionPolicy("lof", max_wait_steps=1 + seed % 5))


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("mode", ["static", "naive"])
def test_baseline_modes_keep_invariants(mode, async_):
    for seed in range(8):
        run_random_stream(seed, mode, async_)


def test_naive_runs_one_request_at_a_time():
    kv = KVCacheManager(64, 4)
    sched = Scheduler(SchedulerConfig(8, 1024, "naive"), kv, 10_000)
    for i in range(3):
        sched.add_request(Request(str(i), [1, 2, 3], SamplingParams(max_tokens=3)))
    while sched.has_unfinished():
        out = sched.schedule()
        assert len(out.scheduled) == 1
        sched.update_from_output(out, [[5] * s.num_samples for s in out.scheduled])


def test_static_batch_admits_nobody_until_done():
    kv = KVCacheManager(64, 4)
    sched = Scheduler(SchedulerConfig(2, 1024, "static"), kv, 10_000)
    reqs = [Request(str(i), [1, 2, 3], SamplingParams(max_tokens=2 + i)) for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    out = sched.schedule()
    assert [s.request for s in out.scheduled] == reqs[:2]
    while reqs[1].status == RequestStatus.RUNNING:
        assert reqs[2].status == RequestStatus.WAITING
        sched.update_from_output(out, [[5] * s.num_samples for s in out.scheduled])
        out = sched.schedule()
        if reqs[1].is_finished:
            break
        assert reqs[2] not in [s.request for s in out.scheduled]


def test_decode_first_and_newest_preempted():
    kv = KVCacheManager(4, 4)  # 16 token slots
    sched = Scheduler(SchedulerConfig(8, 1024, "continuous"), kv, 10_000)
    old, new = (
        Request("old", [1] * 7, SamplingParams(max_tokens=20)),
        Request("new", [2] * 8, SamplingParams(max_tokens=20)),
    )
    sched.add_request(old)
    sched.add_request(new)
    out = sched.schedule()
    assert [s.num_new_tokens for s in out.scheduled] == [7, 8]
    sched.update_from_output(out, [[3], [3]])
    # old: 8 tokens in 2 blocks, new: 9 tokens needs a 3rd block... pool has 4 blocks: new fits, then old
    # needs a 3rd block at token 9 and the newest request is preempted to make room.
    for _ in range(10):
        out = sched.schedule()
        sched.update_from_output(out, [[3] * s.num_samples for s in out.scheduled])
        sched.check_invariants()
        if sched.num_preemptions:
            break
    assert sched.num_preemptions >= 1
    assert new.status == RequestStatus.PREEMPTED and new.num_computed_tokens == 0
    assert old.status == RequestStatus.RUNNING


# -- deterministic edges: each test below killed a mutant that the random streams let live ----------------


def step(sched: Scheduler, token: int = 5) -> SchedulerOutput:
    """One synchronous step, sampling `token` for every sample."""
    out = sched.schedule()
    sched.update_from_output(out, [[token] * s.num_samples for s in out.scheduled])
    sched.check_invariants()
    return out


def work(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(s.request.request_id, s.num_new_tokens) for s in out.scheduled]


def test_decodes_go_before_an_unfinished_prefill_even_when_it_is_older() -> None:
    """n = 2 forks its second sample after the prefill, so the running order becomes a, b (mid-prefill),
    a#1: every decode is scheduled before b's next chunk takes the rest of the budget."""
    kv = KVCacheManager(64, 4)
    sched = Scheduler(SchedulerConfig(8, 4), kv, 10_000)
    a = Request("a", [1, 2], SamplingParams(max_tokens=3, n=2))
    b = Request("b", list(range(10, 20)), SamplingParams(max_tokens=1))
    sched.add_request(a)
    sched.add_request(b)
    assert work(step(sched)) == [("a", 2), ("b", 2)]
    assert [r.request_id for r in sched.running] == ["a", "b", "a#1"]
    assert work(step(sched)) == [("a", 1), ("a#1", 1), ("b", 2)]


def test_the_newest_unscheduled_request_is_preempted_to_the_queue_head() -> None:
    kv = KVCacheManager(4, 4, enable_prefix_caching=False)  # 16 slots
    sched = Scheduler(SchedulerConfig(2, 64), kv, 10_000)
    old = Request("old", [1, 2, 3], SamplingParams(max_tokens=8))
    new = Request("new", [4] * 9, SamplingParams(max_tokens=4))
    late = Request("late", [5, 6], SamplingParams(max_tokens=1))  # waits for a seat
    for r in (old, new, late):
        sched.add_request(r)
    assert work(step(sched)) == [("old", 3), ("new", 9)]  # the pool is full
    assert work(step(sched)) == [("old", 1), ("new", 1)]
    out = step(sched)  # old's 5th token needs a block: new is the newest not yet given work
    assert out.preempted == [new] and work(out) == [("old", 1)]
    assert old.status == RequestStatus.RUNNING and new.status == RequestStatus.PREEMPTED
    assert list(sched.waiting) == [new, late]


def test_nobody_joins_in_a_step_that_preempted() -> None:
    """b preempts itself for a block; under the small budget its recompute (one chunk) would fit what it
    freed, but it must not rejoin in the same step (it would thrash)."""
    kv = KVCacheManager(4, 4, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(8, 4), kv, 10_000)
    a = Request("a", [1, 2, 3], SamplingParams(max_tokens=8))
    b = Request("b", [4] * 9, SamplingParams(max_tokens=4))
    sched.add_request(a)
    sched.add_request(b)
    preempting = None
    for _ in range(10):
        out = step(sched)
        if out.preempted:
            preempting = out
            break
    assert preempting is not None and preempting.preempted == [b]
    assert work(preempting) == [("a", 1)] and list(sched.waiting) == [b]


def test_a_step_that_preempts_all_it_runs_readmits_the_head() -> None:
    """Async: a's last token is in flight (a is skipped but still holds its blocks); its fork a#1 recomputes
    after a preemption and preempts itself for a block. With nothing left to run, a#1 (now the queue
    head) is re-admitted in the same step with the blocks it freed, rather than leaving the step empty."""
    kv = KVCacheManager(4, 2, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(2, 2), kv, 10_000)
    driver = Driver(sched, async_=True)
    sched.add_request(Request("a", [44, 29], SamplingParams(max_tokens=5, n=2, ignore_eos=True)))
    preempted = 0
    while driver.has_unfinished():
        out = driver.step(lambda: 11)
        sched.check_invariants()
        preempted += len(out.preempted)
        if out.preempted:
            assert out.scheduled, "a step that preempted scheduled nothing"
    assert preempted >= 1


def test_a_request_preempted_with_a_token_in_flight_waits_for_it() -> None:
    """Async: b is preempted while its last sampled token is still in flight. It rejoins once that token is
    known (from the next step on), not in the step that preempted it, though nothing else runs then."""
    kv = KVCacheManager(6, 2)
    sched = Scheduler(SchedulerConfig(4, 2), kv, 10_000)
    driver = Driver(sched, async_=True)
    a = Request("a", [44, 53], SamplingParams(max_tokens=7, ignore_eos=True))
    b = Request("b", [44, 53], SamplingParams(max_tokens=6, ignore_eos=True))
    sched.add_request(a)
    in_flight = 0

    def check(out: SchedulerOutput) -> None:  # before the step in flight is applied
        nonlocal in_flight
        for r in out.preempted:
            if r.num_pending:
                in_flight += 1
                assert all(s.request is not r for s in out.scheduled), f"{r} rejoined too early"

    for i in range(40):
        if i == 4:
            sched.add_request(b)
        if not driver.has_unfinished():
            break
        driver.step(lambda: 11, check)
        sched.check_invariants()
    assert in_flight >= 1 and a.is_finished and b.is_finished


def test_prompt_tokens_count_only_the_prompt_of_a_recompute() -> None:
    kv = KVCacheManager(16, 4, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(4, 64), kv, 10_000)
    r = Request("r", [1, 2, 3], SamplingParams(max_tokens=5))
    sched.add_request(r)
    assert step(sched).num_prompt_tokens == 3
    assert step(sched).num_prompt_tokens == 0  # a decode
    sched._preempt(r)
    out = step(sched)  # the recompute: 3 prompt tokens and 2 generated ones
    assert work(out) == [("r", 5)] and out.num_prompt_tokens == 3


def test_a_static_batch_is_formed_whole_even_past_the_budget() -> None:
    """Static members join together; a member left without budget this step holds its seat and is
    scheduled from the next step on (never with zero tokens)."""
    kv = KVCacheManager(64, 4)
    sched = Scheduler(SchedulerConfig(4, 4, "static"), kv, 10_000)
    a = Request("a", list(range(10, 16)), SamplingParams(max_tokens=2))
    b = Request("b", list(range(20, 26)), SamplingParams(max_tokens=2))
    sched.add_request(a)
    sched.add_request(b)
    assert work(step(sched)) == [("a", 4)]
    assert sched.running == [a, b] and not sched.waiting
    assert work(step(sched)) == [("a", 2), ("b", 2)]


def test_a_static_member_joins_only_if_every_whole_prompt_fits() -> None:
    """a's first chunk takes one block and promises two more for the rest of its prompt; b's whole prompt
    (3 blocks) fits the 4 free blocks only if that promise is ignored."""
    kv = KVCacheManager(5, 4, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(4, 4, "static"), kv, 10_000)
    a = Request("a", list(range(10, 22)), SamplingParams(max_tokens=1))
    b = Request("b", list(range(30, 42)), SamplingParams(max_tokens=1))
    sched.add_request(a)
    sched.add_request(b)
    assert work(step(sched)) == [("a", 4)]
    assert sched.running == [a] and list(sched.waiting) == [b]
    while sched.has_unfinished():
        step(sched)
    assert a.num_output_tokens == b.num_output_tokens == 1 and sched.num_preemptions == 0


def test_a_prompt_over_the_left_budget_is_chunked_in() -> None:
    kv = KVCacheManager(64, 4)
    sched = Scheduler(SchedulerConfig(8, 8), kv, 10_000)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=2)))
    sched.add_request(Request("b", list(range(10, 16)), SamplingParams(max_tokens=2)))
    assert work(step(sched)) == [("a", 3), ("b", 5)]


def test_an_n_request_takes_one_seat_per_sample_once_forked() -> None:
    kv = KVCacheManager(64, 4)
    sched = Scheduler(SchedulerConfig(3, 64), kv, 10_000)
    sched.add_request(Request("p", [1, 2], SamplingParams(max_tokens=4, n=2)))
    assert work(step(sched)) == [("p", 2)]
    sched.add_request(Request("q", [3, 4], SamplingParams(max_tokens=1)))
    assert work(step(sched)) == [("p", 1), ("p#1", 1), ("q", 2)]
