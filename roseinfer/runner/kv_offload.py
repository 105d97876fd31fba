"""The CPU tier's bytes: pinned host block slots, and the copies the KV cache manager plans (kv/offload.py).

A block spans every layer and sits contiguous in the block-major cache, so one block is one copy; runs of
consecutive blocks to consecutive slots are merged into one. On CUDA loads and stores run on streams of their
own. A step's loads are queued before its forward, which waits for them; they wait for the step in flight
only where a target block may still be written by it. Its stores are queued after its forward (and after
every load queued so far, which may read a slot they overwrite) and overlap the steps that follow; a stored
block stays held, and its slot unloadable, until `completed` reports the store.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

GIB = 2**30


def copy_runs(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(src, dst, length) runs covering `pairs` in order, each merging pairs that go on by one on both sides."""
    runs: list[tuple[int, int, int]] = []
    for src, dst in pairs:
        if runs:
            s, d, n = runs[-1]
            if src == s + n and dst == d + n:
                runs[-1] = (s, d, n + 1)
                continue
        runs.append((src, dst, 1))
    return runs


def cpu_tier_num_blocks(size_gib: float, block_bytes: int) -> int:
    return int(size_gib * GIB) // block_bytes


class KVOffloader:
    def __init__(self, kv_cache: torch.Tensor, num_slots: int) -> None:
        self.kv_cache = kv_cache
        self.cuda = kv_cache.device.type == "cuda"
        self.host = torch.empty((num_slots, *kv_cache.shape[1:]), dtype=kv_cache.dtype, pin_memory=self.cuda)
        self.load_stream = torch.cuda.Stream(kv_cache.device) if self.cuda else None
        self.store_stream = torch.cuda.Stream(kv_cache.device) if self.cuda else None
        self.inflight: deque[tuple[torch.cuda.Event, list[tuple[int, int]]]] = (
            deque()
        )  # stores not known done
        self.done: list[tuple[int, int]] = []  # stores done (synchronously, off CUDA), not reported yet
        self.num_load_copies = 0
        self.num_store_copies = 0

    @property
    def busy(self) -> bool:
        return bool(self.inflight or self.done)

    def load(self, pairs: Sequence[tuple[int, int]], wait_for_step: bool) -> None:
        """(host slot, block) copies, finished before anything queued on the compute stream after this call."""
        runs = copy_runs(pairs)
        self.num_load_copies += len(runs)
        if self.load_stream is None:
            for s, b, n in runs:
                self.kv_cache[b : b + n].copy_(self.host[s : s + n])
            return
        compute = torch.cuda.current_stream(self.kv_cache.device)
        if wait_for_step:
            self.load_stream.wait_stream(compute)
        with torch.cuda.stream(self.load_stream):
            for s, b, n in runs:
                self.kv_cache[b : b + n].copy_(self.host[s : s + n], non_blocking=True)
        compute.wait_stream(self.load_stream)

    def store(self, pairs: Sequence[tuple[int, int]]) -> None:
        """(block, host slot) copies of blocks whose content is queued on the compute stream by now."""
        runs = copy_runs(pairs)
        self.num_store_copies += len(runs)
        if self.store_stream is None or self.load_stream is None:
            for b, s, n in runs:
                self.host[s : s + n].copy_(self.kv_cache[b : b + n])
            self.done += pairs
            return
        self.store_stream.wait_stream(torch.cuda.current_stream(self.kv_cache.device))
        self.store_stream.wait_stream(self.load_stream)
        with torch.cuda.stream(self.store_stream):
            for b, s, n in runs:
                self.host[s : s + n].copy_(self.kv_cache[b : b + n], non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.store_stream)
        self.inflight.append((event, list(pairs)))

    def completed(self, wait: bool = False) -> list[tuple[int, int]]:
        """(block, slot) stores finished since the last call (`wait`: after waiting for all of them)."""
        done, self.done = self.done, []
        while self.inflight and (wait or self.inflight[0][0].query()):
            event, pairs = self.inflight.popleft()
            event.synchronize()
            done += pairs
        return done
