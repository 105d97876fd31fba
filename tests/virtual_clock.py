"""A clock that moves only when told, for driving the online benchmarks' loops without waiting."""

from __future__ import annotations


class VirtualClock:
    """`monotonic()` reads it; `sleep(seconds)` moves it (never back), as does setting `now`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds
