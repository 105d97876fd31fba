"""The CPU tier's bytes: pinned host block slots, and the copies the KV cache manager plans (kv/offload.py).

A block spans every layer and sits contiguous in the block-major cache. The GPU blocks of a batch of copies lie
anywhere in the cache while their slots mostly run on (a prompt's blocks are stored together), so the copies go
through a staging buffer on the device, a chunk of blocks at a time: a load copies each run of consecutive
slots into it in one host-to-device copy, then scatters it into the cache in one `index_copy_`; a store
gathers its blocks with one `index_select`, then copies each run of slots out in one device-to-host copy.

On CUDA loads and stores run on streams of their own. A step's loads are queued before its forward, which waits
for them; they wait for the step in flight only where a target block may still be written by it. Its stores are
queued after its forward (and after every load queued so far, which may read a slot they overwrite) and
overlap the steps that follow; a stored block stays held, and its slot unloadable, until `completed` reports
the store.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

import torch

from roseinfer.config import CacheConfig

GIB = 2**30
STAGING_BYTES = 64 * 2**20  # per direction


def slot_runs(slots: Sequence[int]) -> list[tuple[int, int]]:
    """(first slot, length) runs covering `slots` in order, each merging slots that go on by one."""
    runs: list[tuple[int, int]] = []
    for s in slots:
        if runs and s == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((s, 1))
    return runs


def last_per_target(pairs: Sequence[tuple[int, int]], slot_at: int) -> list[tuple[int, int]]:
    """(src, dst) `pairs`, one per dst (the last: a later copy there supersedes an earlier one), sorted by the
    slot, at position `slot_at` of each pair."""
    last = {p[1]: p for p in pairs}
    return sorted(last.values(), key=lambda p: p[slot_at])


def cpu_tier_num_blocks(cache: CacheConfig, block_bytes: int) -> int:
    """The CPU tier's slots: `num_cpu_blocks`, else as many blocks as `kv_offloading_size` GiB holds."""
    if cache.num_cpu_blocks is not None:
        return cache.num_cpu_blocks
    return int(cache.kv_offloading_size * GIB) // block_bytes


def staging_blocks(num_slots: int, block_bytes: int, staging_bytes: int = STAGING_BYTES) -> int:
    """Blocks a staging buffer holds: `staging_bytes` worth, at least one, at most the tier's slots."""
    return max(1, min(num_slots, staging_bytes // block_bytes))


class KVOffloader:
    def __init__(self, kv_cache: torch.Tensor, num_slots: int, staging_bytes: int = STAGING_BYTES) -> None:
        # Blocks as rows of bytes: every copy and index op here exists for uint8, whatever the cache's dtype.
        self.kv_cache = kv_cache.view(kv_cache.shape[0], -1).view(torch.uint8)
        self.cuda = kv_cache.device.type == "cuda"
        block_bytes = self.kv_cache.shape[1]
        self.host = torch.empty((num_slots, block_bytes), dtype=torch.uint8, pin_memory=self.cuda)
        self.chunk = staging_blocks(num_slots, block_bytes, staging_bytes)
        self.load_staging = torch.empty((self.chunk, block_bytes), dtype=torch.uint8, device=kv_cache.device)
        self.store_staging = torch.empty_like(self.load_staging)
        self.load_stream = torch.cuda.Stream(kv_cache.device) if self.cuda else None
        self.store_stream = torch.cuda.Stream(kv_cache.device) if self.cuda else None
        self.inflight: deque[tuple[torch.cuda.Event, list[tuple[int, int]]]] = (
            deque()
        )  # stores not known done
        self.done: list[tuple[int, int]] = []  # stores done (synchronously, off CUDA), not reported yet
        self.num_load_copies = 0  # host-to-device copies (one per run of slots per chunk)
        self.num_store_copies = 0

    @property
    def busy(self) -> bool:
        return bool(self.inflight or self.done)

    def _chunks(self, pairs: list[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
        for i in range(0, len(pairs), self.chunk):
            yield pairs[i : i + self.chunk]

    def _index(self, blocks: list[int]) -> torch.Tensor:
        host = torch.tensor(blocks, dtype=torch.long)
        if not self.cuda:
            return host
        return host.pin_memory().to(self.kv_cache.device, non_blocking=True)

    def _load(self, pairs: list[tuple[int, int]]) -> None:
        for chunk in self._chunks(last_per_target(pairs, slot_at=0)):
            k = 0
            for s, n in slot_runs([s for s, _ in chunk]):
                self.load_staging[k : k + n].copy_(self.host[s : s + n], non_blocking=True)
                k += n
                self.num_load_copies += 1
            self.kv_cache.index_copy_(0, self._index([b for _, b in chunk]), self.load_staging[:k])

    def _store(self, pairs: list[tuple[int, int]]) -> None:
        for chunk in self._chunks(last_per_target(pairs, slot_at=1)):
            staged = self.store_staging[: len(chunk)]
            torch.index_select(self.kv_cache, 0, self._index([b for b, _ in chunk]), out=staged)
            k = 0
            for s, n in slot_runs([s for _, s in chunk]):
                self.host[s : s + n].copy_(staged[k : k + n], non_blocking=True)
                k += n
                self.num_store_copies += 1

    def load(self, pairs: Sequence[tuple[int, int]], wait_for_step: bool) -> None:
        """(host slot, block) copies, finished before anything queued on the compute stream after this call."""
        if self.load_stream is None:
            self._load(list(pairs))
            return
        compute = torch.cuda.current_stream(self.kv_cache.device)
        if wait_for_step:
            self.load_stream.wait_stream(compute)
        with torch.cuda.stream(self.load_stream):
            self._load(list(pairs))
        compute.wait_stream(self.load_stream)

    def store(self, pairs: Sequence[tuple[int, int]]) -> None:
        """(block, host slot) copies of blocks whose content is queued on the compute stream by now."""
        if self.store_stream is None or self.load_stream is None:
            self._store(list(pairs))
            self.done += pairs
            return
        self.store_stream.wait_stream(torch.cuda.current_stream(self.kv_cache.device))
        self.store_stream.wait_stream(self.load_stream)
        with torch.cuda.stream(self.store_stream):
            self._store(list(pairs))
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
