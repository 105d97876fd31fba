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
            assert r.status == RequestStatus.RUNNING
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
