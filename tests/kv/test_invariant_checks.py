"""The invariant checks can fail: each test breaks one rule the way a bug would and sees the check that
tests/conftest.py runs after every schedule() (tests/invariants.py) catch it, before the step writes any KV."""

from __future__ import annotations

import pytest

from roseinfer.config import SchedulerConfig
from roseinfer.kv.manager import KVCacheManager
from roseinfer.request import Request
from roseinfer.sampling_params import SamplingParams
from roseinfer.scheduler.scheduler import Scheduler

BS = 4


def make() -> Scheduler:
    return Scheduler(SchedulerConfig(8, 64, "continuous"), KVCacheManager(16, BS), 10_000)


def greedy(n: int = 1) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=4, n=n, ignore_eos=True)


def test_every_schedule_is_checked() -> None:
    sched = make()
    sched.add_request(Request("a", [1, 2, 3, 4, 5], greedy()))
    out = sched.schedule()
    sched.update_from_output(out, [[9]])
    sched.kv.pool.ref_counts[sched.running[0].block_ids[0]] += 1  # a reference nobody holds
    with pytest.raises(AssertionError, match="ref count 2 != 1 holders"):
        sched.schedule()


def test_a_skipped_copy_on_write_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """n = 2: both samples share the partial prompt block; a manager that never copies lets them write it."""
    monkeypatch.setattr(KVCacheManager, "_must_copy", lambda self, block: False)
    sched = make()
    sched.add_request(Request("a", [1, 2, 3, 4, 5], greedy(n=2)))
    out = sched.schedule()
    sched.update_from_output(out, [[9, 10]])
    assert [len(r.block_ids) for r in sched.running] == [2, 2]
    with pytest.raises(AssertionError, match="writes block .* that others can read"):
        sched.schedule()


def test_a_copy_from_a_block_the_same_step_fills_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two identical prompts admitted in one step: the second may not take the first one's last block, which
    only this step's forward fills, as a copy source."""
    monkeypatch.setattr(KVCacheManager, "usable_prefix", KVCacheManager.find_cached_prefix)
    sched = make()
    for rid in "ab":
        sched.add_request(Request(rid, list(range(1, 2 * BS + 1)), greedy()))
    with pytest.raises(AssertionError, match="a source is a block this step fills"):
        sched.schedule()


def test_two_writers_of_one_block_in_a_step_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, with no copy: the second request writes the first one's block while the first fills it."""
    must_copy = KVCacheManager._must_copy
    monkeypatch.setattr(KVCacheManager, "usable_prefix", KVCacheManager.find_cached_prefix)
    monkeypatch.setattr(
        KVCacheManager, "_must_copy", lambda self, block: block not in self.fresh and must_copy(self, block)
    )
    sched = make()
    for rid in "ab":
        sched.add_request(Request(rid, list(range(1, 2 * BS + 1)), greedy()))
    with pytest.raises(AssertionError, match="both write block"):
        sched.schedule()
