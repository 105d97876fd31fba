"""Continuous batching under a token budget, plus the naive and static baselines.

Pure Python over ids and counts: no tensors. Each `schedule()` returns a plain `SchedulerOutput`;
`update_from_output()` appends the sampled tokens and applies the stop conditions that need no text.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from roseinfer.config import SchedulerConfig
from roseinfer.kv.manager import KVCacheManager
from roseinfer.request import Request, RequestStatus


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # tokens fed this step, starting at request.num_computed_tokens
    sample: bool  # the chunk reaches the end of the known tokens, so the step yields a new token


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # (src, dst), one batched copy

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def has_prefill(self) -> bool:
        return any(s.num_new_tokens > 1 or s.request.num_output_tokens == 0 for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, max_model_len: int) -> None:
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last is the newest
        self.num_preemptions = 0

    # -- queue management -------------------------------------------------------------------------

    def add_request(self, req: Request) -> None:
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, req: Request, status: RequestStatus) -> None:
        """Move `req` to a terminal state and release everything it holds (idempotent per request)."""
        if req.is_finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req)
        req.status = status

    def _preempt(self, req: Request) -> None:
        """Recompute-style preemption: drop the KV, go back to the front of the queue."""
        self.running.remove(req)
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # -- the step ---------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        scheduled: set[int] = set()

        # Running requests first, decodes before unfinished prefills (decode-first).
        order = sorted(self.running, key=lambda r: r.num_tokens - r.num_computed_tokens > 1)
        for req in order:
            if budget == 0:
                break
            if req.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self.kv.allocate_slots(req, num_new):
                victim = self._pick_victim(scheduled)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            if req.status != RequestStatus.RUNNING:
                continue
            scheduled.add(id(req))
            out.scheduled.append(self._scheduled(req, num_new))
            budget -= num_new

        if not out.preempted:
            self._admit(out, budget)
        return out

    def _pick_victim(self, scheduled: set[int]) -> Request:
        candidates = [r for r in self.running if id(r) not in scheduled]
        return candidates[-1]  # the newest request not yet given work this step

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        mode = self.config.mode
        max_seqs = 1 if mode == "naive" else self.config.max_num_seqs
        if mode != "continuous" and self.running:
            return  # static batches: no one joins until the whole batch is done
        while self.waiting and budget > 0 and len(self.running) < max_seqs:
            req = self.waiting[0]
            num_new = req.num_tokens - req.num_computed_tokens
            if num_new > budget and not self.config.enable_chunked_prefill:
                break
            num_new = min(num_new, budget)
            if not self.kv.allocate_slots(req, num_new):
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(self._scheduled(req, num_new))
            budget -= num_new

    @staticmethod
    def _scheduled(req: Request, num_new: int) -> ScheduledRequest:
        return ScheduledRequest(req, num_new, req.num_computed_tokens + num_new == req.num_tokens)

    def update_from_output(self, out: SchedulerOutput, sampled: list[int | None]) -> list[Request]:
        """`sampled[i]` is the token for `out.scheduled[i]` (None where it did not sample)."""
        finished = []
        for s, token in zip(out.scheduled, sampled, strict=True):
            req = s.request
            req.num_computed_tokens += s.num_new_tokens
            if not s.sample or token is None or req.is_finished:
                continue
            req.append_token(token)
            status = req.check_stop_token(self.max_model_len)
            if status is not None:
                self.finish(req, status)
                finished.append(req)
        return finished

    def check_invariants(self) -> None:
        self.kv.check_invariants(self.running)
        for req in self.waiting:
            if req.block_ids and req.status == RequestStatus.PREEMPTED:
                raise AssertionError(f"preempted {req} still holds blocks")
        if len({id(r) for r in self.running} & {id(r) for r in self.waiting}):
            raise AssertionError("a request is both running and waiting")
