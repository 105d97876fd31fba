"""Admission order for the waiting queue: fcfs, or longest cached prefix first with aging."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from roseinfer.request import Request

POLICIES = ("fcfs", "lpm")


@dataclass(frozen=True)
class AdmissionPolicy:
    name: str = "fcfs"
    # lpm: a request that has waited this many scheduler steps goes ahead of every cache-warm one,
    # so a cache-cold request is never starved by a stream of hits.
    max_wait_steps: int = 64
    # lpm: only this many requests from the head of the queue are ranked (bounds the per-step cost).
    window: int = 256

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"admission policy must be one of {POLICIES}, got {self.name!r}")

    def order(
        self, waiting: list[Request], cached_tokens: Callable[[Request], int], step: int
    ) -> list[Request]:
        if self.name == "fcfs" or len(waiting) < 2:
            return waiting
        head, tail = waiting[: self.window], waiting[self.window :]
        overdue = [r for r in head if step - r.enqueued_step >= self.max_wait_steps]
        overdue.sort(key=lambda r: (r.enqueued_step, r.arrival_time))  # fcfs among the overdue
        fresh = [r for r in head if step - r.enqueued_step < self.max_wait_steps]
        fresh.sort(key=lambda r: -cached_tokens(r))  # stable: fcfs among equal hits
        return overdue + fresh + tail
