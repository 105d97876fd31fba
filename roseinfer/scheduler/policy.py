"""Admission order for the waiting queue.

- fcfs: arrival order.
- lpm: longest cached prefix first, so that cache hits are taken while their blocks are still warm.
- lof: longest remaining output (max_tokens) first. With a small token budget, the requests that decode
  longest start first and the short ones are prefilled later, in chunks that ride in memory-bound decode
  steps instead of compute-bound prefill steps up front. That pays only when a mixed step costs the host
  no more than the GPU. Eager mixed steps did not, and lof measured slower on W2 llama (twelfth session).
  Since they replay CUDA graphs, lof with a 512-token budget ran 6% faster than fcfs in one lease
  (docs/PERFORMANCE.md, fourteenth session; `scripts/sim_w2_schedule.py` models the schedule).

lpm and lof age: a request that has waited `max_wait_steps` steps goes ahead of the ranked ones, so no
request is starved by a stream of better-ranked arrivals. Among the overdue, lpm goes first come first
served; lof ranks those that arrived within the same `max_wait_steps` window by output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from roseinfer.request import Request

POLICIES = ("fcfs", "lpm", "lof")


@dataclass(frozen=True)
class AdmissionPolicy:
    name: str = "fcfs"
    max_wait_steps: int = 64
    # Only this many requests from the head of the queue are ranked (bounds the per-step cost).
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
        fresh = [r for r in head if step - r.enqueued_step < self.max_wait_steps]
        if self.name == "lpm":
            overdue.sort(key=lambda r: (r.enqueued_step, r.arrival_time))  # fcfs among the overdue
            fresh.sort(key=lambda r: -cached_tokens(r))  # stable: fcfs among equal hits
        else:
            # Overdue requests go by the window of steps they arrived in, and by output within one: a
            # batch that arrived together (offline) keeps its longest-first order however long it waits.
            overdue.sort(key=lambda r: (r.enqueued_step // self.max_wait_steps, _remaining_output(r)))
            fresh.sort(key=_remaining_output)
        return overdue + fresh + tail


def _remaining_output(r: Request) -> int:
    """Sort key, ascending: the most output tokens still to go first."""
    return r.num_output_tokens - r.params.max_tokens
