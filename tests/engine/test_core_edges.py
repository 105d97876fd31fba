"""EngineCore edges the mutation audit found untested: an aborted request's sampling generator is freed, and a
scheduler that stops making progress is an error, not an endless loop of empty steps."""

from __future__ import annotations

import pytest

from roseinfer import SamplingParams
from roseinfer.scheduler.scheduler import SchedulerOutput
from tests.engine.test_min_tokens import make


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_an_aborted_seeded_request_leaves_no_generator(llama_dir, async_scheduling) -> None:
    engine = make(llama_dir, async_scheduling).engine
    rid = engine.add_request(
        [5, 6, 7], SamplingParams(temperature=1.0, seed=4, max_tokens=20, ignore_eos=True)
    )
    for _ in range(3):
        engine.step()
    assert engine.core.runner.sampling.generators, "a seeded request samples from a generator of its own"
    engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    assert not engine.core.runner.sampling.generators


@pytest.mark.no_invariant_hook  # the scheduler is broken on purpose
def test_a_scheduler_that_makes_no_progress_is_an_error(llama_dir, monkeypatch) -> None:
    engine = make(llama_dir, async_scheduling=False).engine
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=2))
    monkeypatch.setattr(engine.core.scheduler, "schedule", lambda: SchedulerOutput())
    with pytest.raises(RuntimeError, match="scheduler made no progress"):
        engine.step()
