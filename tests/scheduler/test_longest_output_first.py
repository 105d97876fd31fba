"""The lof admission policy: longest remaining output first, aging by arrival window."""

from __future__ import annotations

import random

import pytest

from roseinfer.config import SchedulerConfig
from roseinfer.kv.manager import KVCacheManager
from roseinfer.request import Request
from roseinfer.sampling_params import SamplingParams
from roseinfer.scheduler.policy import AdmissionPolicy
from roseinfer.scheduler.scheduler import Scheduler


def request(rid: str, max_tokens: int, enqueued_step: int = 0, prompt_len: int = 5) -> Request:
    first = 10 + 100 * len(rid) + sum(map(ord, rid))  # distinct prompts: no prefix-cache hits
    r = Request(rid, list(range(first, first + prompt_len)), SamplingParams(max_tokens=max_tokens))
    r.enqueued_step = enqueued_step
    return r


def no_cache(r: Request) -> int:
    raise AssertionError("lof must not look up the prefix cache")


@pytest.mark.parametrize("seed", range(5))
def test_fresh_requests_go_by_remaining_output_stable_among_equals(seed):
    rng = random.Random(seed)
    waiting = [request(str(i), rng.choice([1, 3, 7, 7, 20, 64])) for i in range(rng.randint(2, 40))]
    for r in rng.sample(waiting, k=len(waiting) // 3):  # preempted ones carry generated tokens
        r.output_token_ids = [5] * rng.randint(0, r.params.max_tokens - 1)
    got = AdmissionPolicy("lof").order(list(waiting), no_cache, step=0)
    remaining = [r.params.max_tokens - r.num_output_tokens for r in got]
    assert remaining == sorted(remaining, reverse=True)
    for a, b in zip(got, got[1:]):
        if a.params.max_tokens - a.num_output_tokens == b.params.max_tokens - b.num_output_tokens:
            assert waiting.index(a) < waiting.index(b)  # arrival order among equals


def test_overdue_go_first_by_arrival_window_then_by_output():
    policy = AdmissionPolicy("lof", max_wait_steps=4)
    old_short, old_long = request("old_short", 2, enqueued_step=0), request("old_long", 9, enqueued_step=3)
    mid = request("mid", 50, enqueued_step=5)  # overdue at step 10, in a later window than the old ones
    fresh_long = request("fresh_long", 100, enqueued_step=9)
    got = policy.order([fresh_long, mid, old_short, old_long], no_cache, step=10)
    assert [r.request_id for r in got] == ["old_long", "old_short", "mid", "fresh_long"]


def test_only_the_window_is_ranked():
    policy = AdmissionPolicy("lof", window=3)
    waiting = [request(str(i), m) for i, m in enumerate([1, 2, 3, 99, 98])]
    got = policy.order(list(waiting), no_cache, step=0)
    assert [r.request_id for r in got] == ["2", "1", "0", "3", "4"]


def test_scheduler_admits_longest_output_first_and_chunks_the_rest_under_a_small_budget():
    kv = KVCacheManager(256, 4)
    sched = Scheduler(SchedulerConfig(8, 12), kv, 10_000, AdmissionPolicy("lof"))
    lens = [3, 40, 8, 40, 1, 17]
    reqs = [request(f"r{i}", m, prompt_len=5) for i, m in enumerate(lens)]
    for r in reqs:
        sched.add_request(r)
    first_scheduled: list[str] = []
    steps = 0
    while sched.has_unfinished():
        out = sched.schedule()
        assert out.num_tokens <= 12
        for s in out.scheduled:
            if s.start == 0:
                first_scheduled.append(s.request.request_id)
        sched.update_from_output(out, [[7] * s.num_samples for s in out.scheduled])
        sched.check_invariants()
        steps += 1
    order = sorted(range(len(lens)), key=lambda i: (-lens[i], i))
    assert first_scheduled == [f"r{i}" for i in order]
    assert all(r.num_output_tokens == r.params.max_tokens for r in reqs)
    assert steps <= max(lens) + 2  # the short ones were prefilled while the long ones decoded


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="admission policy"):
        AdmissionPolicy("sjf")
