"""Continuous batching under a token budget, plus the naive and static baselines.

Pure Python over ids and counts: no tensors. Each `schedule()` returns a plain `SchedulerOutput` and
commits it: computed counts advance and every sampling request gets a pending token. Later,
`update_from_output()` turns the pending tokens into sampled ids and applies the stop conditions that
need no text. With async scheduling the next `schedule()` runs before that update: a pending token is
then fed to the next step from the device, and a request whose pending token reaches its length limit
is not scheduled again.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field

from roseinfer.config import SchedulerConfig
from roseinfer.kv.block_tables import BlockTables
from roseinfer.kv.manager import KVCacheManager
from roseinfer.logprobs import TokenLogprobs
from roseinfer.request import Request, RequestStatus
from roseinfer.scheduler.policy import AdmissionPolicy


@dataclass(slots=True)  # one per running request per step: slots make it cheaper to build and read
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # tokens fed this step, starting at `start`
    num_samples: int  # 0: the chunk ends inside known tokens; 1; or n for the prefill of an n > 1 request
    start: int = 0  # request.num_computed_tokens when it was scheduled

    @property
    def sample(self) -> bool:
        return self.num_samples > 0


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # (src, dst): one batched copy
    num_prompt_tokens: int = 0  # tokens of prompts (not of generated text) computed this step
    # The KV cache manager's mirror of the block tables, as of this schedule() (None: read block_ids).
    tables: BlockTables | None = None
    # (index in `scheduled`, first position, end position): the prompt positions whose logprobs a request
    # asking for them computes this step (`Request.prompt_logprobs`); empty in most steps.
    prompt_logprobs: list[tuple[int, int, int]] = field(default_factory=list)
    # The CPU tier's copies (kv/offload.py): (host slot, block) loads before the forward, and whether they
    # must wait for the step in flight; (block, host slot) stores after it.
    kv_loads: list[tuple[int, int]] = field(default_factory=list)
    kv_loads_wait: bool = False
    kv_stores: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def has_prefill(self) -> bool:
        return self.num_prompt_tokens > 0 or any(s.num_new_tokens > 1 for s in self.scheduled)

    @property
    def forks(self) -> bool:
        """Some request samples n > 1 tokens: its forks appear only once the step's tokens are known."""
        return any(s.num_samples > 1 for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        max_model_len: int,
        policy: AdmissionPolicy | None = None,
    ) -> None:
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.policy = policy or AdmissionPolicy()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last is the newest
        self.num_preemptions = 0
        # Requests finished, by RequestStatus value (stop, length, abort).
        self.num_finished: Counter[str] = Counter()
        self.num_steps = 0
        self._promised = 0

    # -- queue management -------------------------------------------------------------------------

    def add_request(self, req: Request) -> None:
        req.enqueued_step = self.num_steps
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
        req.finished_time = time.monotonic()
        self.num_finished[status.value] += 1

    def restate_finished(self, req: Request, status: RequestStatus) -> None:
        """Gives a finished request another terminal reason, its count moving with it: a stop string found in
        the text of the token that also finished it for length makes it stopped, as vLLM's output says."""
        assert req.is_finished and status.finished
        self.num_finished[req.status.value] -= 1
        req.status = status
        self.num_finished[status.value] += 1

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
        step = self.num_steps
        self.kv.begin_step()

        # Running requests first, decodes before unfinished prefills (decode-first). This loop runs for
        # every request on every step, so it reads fields rather than properties.
        decodes, prefills = [], []
        for r in self.running:
            todo = len(r.all_token_ids) + r.num_pending - r.num_computed_tokens
            (prefills if todo > 1 else decodes).append(r)
        running = RequestStatus.RUNNING
        allocate, register = self.kv.allocate_slots, self.kv.register_scheduled
        scheduled = out.scheduled
        for req in decodes + prefills if prefills else decodes:
            if budget == 0:
                break
            if req.status is not running:
                continue  # preempted earlier in this loop
            if req.num_pending and req.reached_length_limit(self.max_model_len):
                continue  # its last token is in flight: the update finishes it
            num_new = min(len(req.all_token_ids) + req.num_pending - req.num_computed_tokens, budget)
            while not allocate(req, num_new):
                victim = self._pick_victim(step)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            if req.status is not running:
                continue
            req.scheduled_step = step
            scheduled.append(self._scheduled(req, num_new))
            register(req, num_new)
            budget -= num_new

        # After a preemption nobody new joins, except when nothing is left to run: then the preempted
        # request itself (now at the queue head) is re-admitted, with whatever prefix it still has cached.
        if not out.preempted or not out.scheduled:
            self._admit(out, budget)
        out.blocks_to_copy = self.kv.take_copies()
        if self.kv.cpu is not None:
            out.kv_loads, out.kv_stores, out.kv_loads_wait = self.kv.take_offload()
        out.tables = self.kv.tables
        self._commit(out)
        self.num_steps += 1
        return out

    @staticmethod
    def _commit(out: SchedulerOutput) -> None:
        prompt_tokens = 0
        for i, s in enumerate(out.scheduled):
            req = s.request
            s.start = start = req.num_computed_tokens
            end = start + s.num_new_tokens
            if start < len(req.prompt_token_ids):
                prompt_tokens += min(len(req.prompt_token_ids), end) - start
                if req.prompt_logprobs is not None:
                    # Positions not held yet (after a preemption) up to the last but one, whose logits
                    # predict the last prompt token; the last position's logits only sample.
                    first = max(start, len(req.prompt_logprobs))
                    last = min(end, len(req.prompt_token_ids) - 1)
                    if first < last:
                        out.prompt_logprobs.append((i, first, last))
            req.num_computed_tokens = end
            if s.num_samples:
                req.num_pending += 1  # n > 1: the forks get theirs in the update
        out.num_prompt_tokens = prompt_tokens

    def _pick_victim(self, step: int) -> Request:
        candidates = [r for r in self.running if r.scheduled_step != step]
        return candidates[-1]  # the newest request not yet given work this step

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        if not self.waiting:
            return
        mode = self.config.mode
        max_seqs = 1 if mode == "naive" else self.config.max_num_seqs
        if mode != "continuous" and self.running:
            return  # static batches: no one joins until the whole batch is done
        if self.policy.name != "fcfs" and len(self.waiting) > 1:
            cached = {}

            def hit(r: Request) -> int:
                if id(r) not in cached:
                    cached[id(r)] = self.kv.find_cached_prefix(r)[1]
                return cached[id(r)]

            self.waiting = deque(self.policy.order(list(self.waiting), hit, self.num_steps))
        # A static batch is formed whole: its members join now and prefill over the next steps.
        form_batch = mode != "continuous"
        self._promised = 0  # blocks the members admitted so far still need for their whole prompts
        # An n > 1 request forks into n sequences after its prefill: it takes n seats from admission on
        # (all of them if it needs more than there are, once the batch is empty), so decode batches stay
        # within max_num_seqs and the captured graphs.
        taken = sum(self._seats(r) for r in self.running)
        while self.waiting and taken < max_seqs and (budget > 0 or form_batch):
            req = self.waiting[0]
            if req.num_pending:
                break  # preempted with a token in flight: it rejoins once that token is known
            if self.running and taken + self._seats(req) > max_seqs:
                break
            prefix = self.kv.usable_prefix(req)
            # The prefix continued from the CPU tier: its blocks are new ones, loaded instead of computed.
            cpu_slots = self.kv.cpu_hit(req, prefix)
            loaded = (prefix[0], prefix[1] + len(cpu_slots) * self.kv.block_size)
            if cpu_slots and not self._fits(req, budget, loaded, form_batch):
                cpu_slots, loaded = [], prefix
            if not cpu_slots and not self._fits(req, budget, prefix, form_batch):
                # The hit block it writes first needs a copy: recomputing it instead takes one block less.
                prefix = self.kv.prefix_without_copy(req, prefix)
                if not self._fits(req, budget, prefix, form_batch):
                    break
                loaded = prefix
            num_new = req.num_tokens - self.kv.admitted_start(req, loaded[1])
            # Without chunked prefill a prompt fits one step's budget (validated), but a preempted request's
            # recompute (prompt + output) may not: it is chunked, or it could never run again. Asked before
            # `admit`, as `admission_fits` is: a rollback would refresh its cached blocks in the LRU order.
            if not (
                num_new <= budget
                or self.config.enable_chunked_prefill
                or form_batch
                or num_new > self.config.max_num_batched_tokens
            ):
                break
            self.kv.admit(req, prefix, cpu_slots)
            num_new = min(num_new, budget)
            if not self.kv.allocate_slots(req, num_new):
                self.kv.free(req)
                req.num_computed_tokens = 0
                break
            if form_batch:  # blocks it still needs for its whole prompt
                self._promised += self.kv.blocks_for(req.num_tokens) - len(req.block_ids)
            self.waiting.popleft()
            if req.status == RequestStatus.WAITING:
                req.num_cached_tokens = req.num_computed_tokens
                # The tokens served from the cache, as `num_cached_tokens` reports them (a whole-prompt hit
                # still computes its last token); as in vLLM, a preempted request's re-admission is no query.
                self.kv.count_query(req.num_tokens, req.num_computed_tokens)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            taken += self._seats(req)
            if num_new > 0:
                out.scheduled.append(self._scheduled(req, num_new))
                self.kv.register_scheduled(req, num_new)
            budget -= num_new

    @staticmethod
    def _seats(req: Request) -> int:
        return req.params.n if req.parent is None and req.num_output_tokens == 0 else 1

    def _fits(self, req: Request, budget: int, prefix: tuple[list[int], int], form_batch: bool) -> bool:
        """Would admitting `req` with `prefix` find its blocks? Asked before `admit`: a rollback would move
        the request's cached blocks to the most recently used end of the free queue.

        Static batches admit a request only while its whole prompt, and every earlier member's, still fit
        the free blocks."""
        if not self.kv.admission_fits(req, budget, prefix):
            return False
        return not form_batch or self.kv.admission_fits(req, req.num_tokens, prefix, reserved=self._promised)

    @staticmethod
    def _scheduled(req: Request, num_new: int) -> ScheduledRequest:
        if req.num_computed_tokens + num_new < len(req.all_token_ids) + req.num_pending:
            return ScheduledRequest(req, num_new, 0)
        if req.output_token_ids or req.num_pending or req.parent is not None:
            return ScheduledRequest(req, num_new, 1)
        return ScheduledRequest(req, num_new, req.params.n)  # the prompt's end: n > 1 forks here

    def update_from_output(
        self,
        out: SchedulerOutput,
        sampled: list[list[int]],
        logprobs: list[list[TokenLogprobs]] | None = None,
    ) -> tuple[list[Request], list[Request]]:
        """`sampled[i]` holds the tokens for `out.scheduled[i]` (empty where it did not sample), and
        `logprobs[i]` their logprobs where the step computed any (some sampled row asked for them).

        Returns (requests that got a token, requests that finished); n > 1 forks appear in the first.
        """
        got, finished = [], []
        running, max_len = RequestStatus.RUNNING, self.max_model_len
        register = self.kv.register_computed
        for i, (s, tokens) in enumerate(zip(out.scheduled, sampled, strict=True)):
            req = s.request
            if len(tokens) != s.num_samples:
                raise ValueError(f"{req} sampled {len(tokens)} tokens, {s.num_samples} were scheduled")
            if tokens:
                req.num_pending -= 1
            if req.status.finished:
                continue  # finished (or aborted) while this step was in flight: its token is dropped
            if s.start < len(req.prompt_token_ids):
                prompt = len(req.prompt_token_ids)
                if (
                    prompt <= s.start + s.num_new_tokens
                    and req.status is running
                    and req.num_computed_tokens >= prompt  # not re-admitted after a preemption meanwhile
                ):
                    self.kv.on_prompt_computed(req)
            if not tokens:
                continue
            family = [req] + [self._fork(req, j) for j in range(1, len(tokens))]
            step_logprobs = logprobs[i] if logprobs is not None else None
            for j, (member, token) in enumerate(zip(family, tokens)):
                got.append(member)
                member.append_token(token, step_logprobs[j] if step_logprobs is not None else None)
                status = member.check_stop_token(max_len)
                if status is not None:
                    self.finish(member, status)
                    finished.append(member)
            if req.status is running:
                register(req)  # blocks whose last token was pending when scheduled
        return got, finished

    def _fork(self, parent: Request, index: int) -> Request:
        child = Request(
            f"{parent.request_id}#{index}",
            parent.prompt_token_ids,
            parent.params,
            parent.eos_token_ids,
            parent.prompt,
            parent.arrival_time,
            parent.cache_salt,
        )
        child.parent, child.sample_index = parent, index
        child.min_tokens_stop_ids = parent.min_tokens_stop_ids  # with eos under ignore_eos, as the parent's
        child.bad_words_token_ids = parent.bad_words_token_ids
        child.num_cached_tokens = parent.num_cached_tokens
        child.prompt_logprobs = None  # the parent computed the prompt's, once for all samples
        self.kv.fork(parent, child)
        child.status = RequestStatus.RUNNING
        self.running.append(child)
        return child

    def check_invariants(self) -> None:
        self.kv.check_invariants(self.running)
        for req in self.waiting:
            if req.block_ids:
                raise AssertionError(f"waiting {req} holds blocks")
        if {id(r) for r in self.running} & {id(r) for r in self.waiting}:
            raise AssertionError("a request is both running and waiting")
