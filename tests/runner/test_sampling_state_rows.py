"""`SamplingState.preempted`: a preempted request gives its penalty row back, and its row is rebuilt from the
host when it samples again."""

from __future__ import annotations

import torch

from roseinfer.runner.sampling_state import SamplingState
from roseinfer.sampling_params import SamplingParams
from tests.runner.test_penalties import VOCAB, request

CPU = torch.device("cpu")


def test_a_preempted_row_is_given_back_and_rebuilt():
    sp = SamplingParams(temperature=0.0, frequency_penalty=1.0)
    state = SamplingState(VOCAB, CPU, 0, 2)
    a, b = request([1], [5, 5], sp, "a"), request([2], [6], sp, "b")
    state.batch([0, 1], [a, b], None)
    table = state.penalty_table
    assert table is not None and len(table.counts) == 2
    state.preempted([b])
    assert b.uid not in table.slot_of and a.uid in table.slot_of
    c = request([3], [7, 7, 7], sp, "c")  # admitted past the preempted request: it finds b's row
    state.batch([0, 1], [a, c], None)
    assert table.counts[table.slot_of[c.uid]].tolist() == [3 if t == 7 else 0 for t in range(VOCAB)]
    state.release(c)
    b.append_token(9)  # what it sampled before it was preempted, known by the time it rejoins
    batch = state.batch([0, 1], [a, b], None)
    assert batch is not None and len(table.counts) == 2
    assert table.counts[table.slot_of[b.uid]].tolist() == [1 if t in (6, 9) else 0 for t in range(VOCAB)]


def test_preempted_and_readmitted_in_one_step_rebuilds_the_cached_batch():
    """The same request alone in two steps keeps the batch's key; preempted in between, the cached penalty rows
    would point at a released row: the batch is rebuilt and the row refilled."""
    sp = SamplingParams(temperature=0.0, presence_penalty=1.0)
    state = SamplingState(VOCAB, CPU, 0, 1)
    a = request([1], [4], sp, "a")
    first = state.batch([0], [a], None)
    state.preempted([a])
    again = state.batch([0], [a], None)
    assert again is not first
    table = state.penalty_table
    assert table is not None and a.uid in table.slot_of
    assert state.penalties is not None and state.penalties.slots.tolist() == [table.slot_of[a.uid]]
