"""A model-free engine whose "KV" is the content key of each cached position, so that every read of the
cache can be checked and greedy output is known in advance.

Each slot of a block holds the key of the prefix it was computed for (a chained hash of the tokens up to and
including that position). A step runs as the runner does: the step's copies first, then every scheduled
token is written (each layer stores before it attends), then every scheduled request reads its whole prefix
through its block table; a read of a slot that holds another prefix's key is a wrong KV read. The sampled
token is a function of the prefix key and the sample index only, so output never depends on batching,
caching, chunking or preemption: each request's output must equal `reference(...)`.

With a CPU tier, a step's loads copy host slots into blocks before anything else, and its stores snapshot
their blocks after the step's writes; a store lands in its slot only when it is reported done, at a random
later step (`rng`), and its block must not have changed meanwhile (the store holds it).
"""

from __future__ import annotations

import random

from roseinfer.kv.manager import KVCacheManager
from roseinfer.request import Request, RequestStatus
from roseinfer.scheduler.scheduler import Scheduler, SchedulerOutput

STOP = 7


def chain(key: int, token: int) -> int:
    return hash((key, token))


def next_token(key: int, sample_index: int) -> int:
    h = hash((key, sample_index, 0x5EED)) & 0xFFFFFFFF
    return STOP if h % 11 == 0 else 10 + h % 50


def keys_of(tokens: list[int]) -> list[int]:
    out, k = [], 0
    for t in tokens:
        k = chain(k, t)
        out.append(k)
    return out


def reference(prompt: list[int], sample_index: int, max_tokens: int, stop: bool, max_len: int) -> list[int]:
    toks = list(prompt)
    key = keys_of(toks)[-1]
    out: list[int] = []
    while True:
        t = next_token(key, sample_index)
        out.append(t)
        toks.append(t)
        key = chain(key, t)
        if (stop and t == STOP) or len(out) >= max_tokens or len(toks) >= max_len:
            return out


class SimEngine:
    """Steps a scheduler as EngineCore does (async: step N+1 is scheduled before step N's tokens are
    applied; a step with forks is applied at once), executing each step against the simulated KV."""

    def __init__(self, sched: Scheduler, async_: bool, rng: random.Random | None = None) -> None:
        self.sched = sched
        self.kv: KVCacheManager = sched.kv
        self.async_ = async_
        self.store: list[list[int | None]] = [[None] * self.kv.block_size for _ in range(self.kv.num_blocks)]
        self.pending: dict[int, list[int]] = {}  # request uid -> tokens sampled, not yet applied
        self.inflight: tuple[SchedulerOutput, list[list[int]]] | None = None
        self.requests: list[Request] = []
        self.terminal: dict[int, RequestStatus] = {}
        self.got: list[Request] = []
        # A request admitted and freed within one schedule() was rolled back: its cached prefix blocks went
        # back to the most recently used end of the free queue, unused.
        self._admitted: set[int] = set()
        self.rng = rng or random.Random(0)
        self.host: dict[int, list[int | None]] = {}  # CPU tier slot -> content
        self.stores: list[tuple[int, int, list[int | None]]] = []  # (block, slot, content) not reported done
        self.num_loads = 0
        admit, free = self.kv.admit, self.kv.free

        def admit_(req: Request, prefix: tuple[list[int], int] | None = None, cpu_slots=()) -> int:
            self._admitted.add(req.uid)
            return admit(req, prefix, cpu_slots)

        def free_(req: Request) -> None:
            assert req.uid not in self._admitted or not req.block_ids, f"{req}: admission rolled back"
            free(req)

        self.kv.admit, self.kv.free = admit_, free_  # type: ignore[method-assign]

    def add(self, req: Request) -> None:
        self.requests.append(req)
        self.sched.add_request(req)

    def has_unfinished(self) -> bool:
        return self.sched.has_unfinished() or self.inflight is not None or bool(self.stores)

    def finish_stores(self, everything: bool) -> None:
        """Report a random leading share of the stores in flight done (all with `everything`), as the runner
        reports them in issue order."""
        n = len(self.stores) if everything else self.rng.randint(0, len(self.stores))
        done, self.stores = self.stores[:n], self.stores[n:]
        for block, slot, content in done:
            assert self.store[block] == content, f"block {block} changed while its store was in flight"
            self.host[slot] = content
        if done:
            self.kv.stores_done([(b, s) for b, s, _ in done])

    def tokens(self, req: Request) -> list[int]:
        return req.all_token_ids + self.pending.get(req.uid, [])

    def step(self) -> SchedulerOutput:
        self._admitted.clear()
        self.finish_stores(everything=False)
        out = self.sched.schedule()
        self._admitted.clear()
        self.check_step(out)
        sampled = self.execute(out)
        if out.is_empty and self.inflight is None:
            self.finish_stores(everything=True)  # as EngineCore: their blocks may be what the waiting need
        self.got = []
        if self.inflight is not None:
            self._apply()
        if not out.is_empty:
            self.inflight = (out, sampled)
            if not self.async_ or out.forks:
                self._apply()
        self.check_after()
        return out

    def execute(self, out: SchedulerOutput) -> list[list[int]]:
        bs = self.kv.block_size
        for slot, block in out.kv_loads:
            assert slot in self.host, f"load from slot {slot}, which no finished store filled"
            self.store[block] = list(self.host[slot])
            self.num_loads += 1
        for src, dst in out.blocks_to_copy:
            self.store[dst] = list(self.store[src])
        written: dict[tuple[int, int], int] = {}
        for s in out.scheduled:
            r = s.request
            keys = keys_of(self.tokens(r))
            assert len(keys) >= s.start + s.num_new_tokens, (r, s)
            for p in range(s.start, s.start + s.num_new_tokens):
                slot = (r.block_ids[p // bs], p % bs)
                if slot in written and written[slot] != keys[p]:
                    raise AssertionError(f"step writes slot {slot} twice with different content")
                written[slot] = keys[p]
                self.store[slot[0]][slot[1]] = keys[p]
        sampled = []
        for s in out.scheduled:
            r = s.request
            end = s.start + s.num_new_tokens
            keys = keys_of(self.tokens(r)[:end])
            for p in range(end):
                got = self.store[r.block_ids[p // bs]][p % bs]
                if got != keys[p]:
                    raise AssertionError(
                        f"{r} reads a wrong KV at position {p} (block {r.block_ids[p // bs]}), "
                        f"cached={r.num_cached_tokens} preemptions={r.num_preemptions}"
                    )
            if s.num_samples:
                first = r.sample_index
                tokens = [next_token(keys[-1], first + j) for j in range(s.num_samples)]
                self.pending.setdefault(r.uid, []).append(tokens[0])
            else:
                tokens = []
            sampled.append(tokens)
        self.stores += [(block, slot, list(self.store[block])) for block, slot in out.kv_stores]
        return sampled

    def _apply(self) -> None:
        assert self.inflight is not None
        out, sampled = self.inflight
        self.inflight = None
        for s, tokens in zip(out.scheduled, sampled):
            if tokens:
                self.pending[s.request.uid].pop(0)
        got, _ = self.sched.update_from_output(out, sampled)
        self.got += got
        for r in got:
            if r.parent is not None and all(r is not q for q in self.requests):
                self.requests.append(r)

    def check_step(self, out: SchedulerOutput) -> None:
        bs = self.kv.block_size
        writers = []
        for s in out.scheduled:
            assert s.request.status is RequestStatus.RUNNING
            for pos in range(s.start, s.start + s.num_new_tokens):
                if pos == s.start or pos % bs == 0:
                    writers.append((s.request, pos))
        self.kv.check_invariants(self.sched.running, writers)
        dsts = [d for _, d in out.blocks_to_copy]
        assert len(set(dsts)) == len(dsts) and not set(dsts) & {src for src, _ in out.blocks_to_copy}

    def check_after(self) -> None:
        self.sched.check_invariants()
        for r in self.requests:
            if r.is_finished:
                if r.uid in self.terminal:
                    assert self.terminal[r.uid] is r.status, f"{r} changed terminal state"
                self.terminal[r.uid] = r.status
                assert not r.block_ids and r.table_row < 0, f"finished {r} holds blocks"
                assert r not in self.sched.running and r not in self.sched.waiting
