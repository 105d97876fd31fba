"""Steps a scheduler as EngineCore does, without a model: tokens come from a callback."""

from __future__ import annotations

from collections.abc import Callable

from roseinfer.scheduler.scheduler import Scheduler, SchedulerOutput


class Driver:
    """With `async_`, step N+1 is scheduled before step N's tokens are applied (a step with n > 1 forks
    is applied at once), as EngineCore does with async scheduling."""

    def __init__(self, sched: Scheduler, async_: bool) -> None:
        self.sched = sched
        self.async_ = async_
        self.inflight: tuple[SchedulerOutput, list[list[int]]] | None = None
        self.got = []  # requests that got a token in the last step() (of the step applied then)

    def has_unfinished(self) -> bool:
        return self.sched.has_unfinished() or self.inflight is not None

    def step(
        self, sample: Callable[[], int], check: Callable[[SchedulerOutput], None] = lambda out: None
    ) -> SchedulerOutput:
        out = self.sched.schedule()
        check(out)
        self.got = []
        if self.inflight is not None:
            self._apply()
        if not out.is_empty:
            self.inflight = (out, [[sample() for _ in range(s.num_samples)] for s in out.scheduled])
            if not self.async_ or out.forks:
                self._apply()
        return out

    def _apply(self) -> None:
        assert self.inflight is not None
        got, _ = self.sched.update_from_output(*self.inflight)
        self.got += got
        self.inflight = None
