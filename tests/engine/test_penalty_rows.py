"""The penalty table holds at most `max_num_seqs` rows, so that start-up sizing knows its worst case
(`runner/sampler_profile.py`): one row per running request with a penalty. An n > 1 request takes its n
seats from admission on and its forks a row each; a preempted request gives its row back (the row is rebuilt
from the host when it samples again), so requests admitted past it find one; and n may not exceed
max_num_seqs (its n samples run at once)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from roseinfer import InvalidRequestError
from roseinfer.runner.penalties import PenaltyTable
from tests.engine.test_min_tokens import PROMPTS, make
from tests.engine.test_penalties import KINDS, check_all, greedy

MAX_SEQS = 3


def watch_rows(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(rows in use, rows allocated) after each `PenaltyTable.step`: where the table grows."""
    seen: list[tuple[int, int]] = []
    real = PenaltyTable.step

    def step(self: PenaltyTable, reqs, last_sampled):
        out = real(self, reqs, last_sampled)
        seen.append((len(self.slot_of), len(self.counts)))
        return out

    monkeypatch.setattr(PenaltyTable, "step", step)
    return seen


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("policy", ["fcfs", "lof"])
def test_rows_stay_within_max_num_seqs_through_forks_and_preemption(
    llama_dir, monkeypatch, async_scheduling, policy
):
    """n = 2 and n = 3 requests beside n = 1 ones, a pool small enough to preempt (recompute), and the
    longest-output-first policy, which admits fresh requests ahead of a preempted one: the table never holds
    more than max_num_seqs rows, and every sample is still penalized by its own output (the reference)."""
    seen = watch_rows(monkeypatch)
    llm = make(
        llama_dir,
        async_scheduling,
        cpu_kv_tokens=64,
        enable_prefix_caching=False,
        max_num_seqs=MAX_SEQS,
        admission_policy=policy,
    )
    kinds = list(KINDS.values())
    params = [
        replace(greedy(10 + 3 * i, **kinds[i % len(kinds)]), n=[1, 2, 3][i % 3]) for i in range(len(PROMPTS))
    ]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert llm.engine.core.scheduler.num_preemptions > 0
    assert check_all(llm, PROMPTS, outs, params) > 0
    assert seen and max(used for used, _ in seen) == MAX_SEQS  # the table fills up
    assert max(allocated for _, allocated in seen) == MAX_SEQS


def test_n_above_max_num_seqs_is_rejected_and_others_complete(llama_dir):
    llm = make(llama_dir, max_num_seqs=MAX_SEQS)
    params = [greedy(4), replace(greedy(4), n=MAX_SEQS + 1), replace(greedy(4), n=MAX_SEQS)]
    with pytest.raises(InvalidRequestError, match=rf"n={MAX_SEQS + 1} .*max_num_seqs={MAX_SEQS}") as info:
        llm.generate(PROMPTS[:3], params, use_tqdm=False)
    assert list(info.value.errors) == [1]
    done = info.value.outputs
    assert len(done[0].outputs) == 1 and len(done[2].outputs) == MAX_SEQS
