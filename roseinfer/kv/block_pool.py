"""A fixed pool of KV block ids with ref counts; the free queue doubles as the LRU eviction order."""

from __future__ import annotations

from collections import OrderedDict


class NoFreeBlocksError(RuntimeError):
    pass


class BlockPool:
    """Block ids 0..num_blocks-1. A block with ref count 0 sits in the free queue, oldest-freed first.

    A free block may still hold cached content (`block_hash[b] is not None`): it stays findable through
    `cached` until `allocate` hands its id out again, which evicts the content. Callers free a
    request's blocks deepest-first so that, among equally old blocks, the least shareable go first.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.cached_len = [0] * num_blocks  # leading slots covered by block_hash: immutable while cached
        self.cached: dict[bytes, int] = {}  # content hash -> block id
        self.pinned: set[int] = set()  # blocks the operator pinned: never evicted
        self.num_evictions = 0
        self.recently_freed: set[int] | None = None  # tracked only for the CPU tier (`KVCacheManager`)

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free_queue):
            raise NoFreeBlocksError(f"asked for {n} blocks, {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            block, _ = self.free_queue.popitem(last=False)
            self._evict(block)
            self.ref_counts[block] = 1
            out.append(block)
        return out

    def _evict(self, block: int) -> None:
        if self.block_hash[block] is not None:
            self.drop_hash(block)
            self.num_evictions += 1

    def incref(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref_counts[b] == 0:
                del self.free_queue[b]  # a cache hit revives a free block
            self.ref_counts[b] += 1

    def free(self, blocks: list[int]) -> None:
        """Drop one reference from each block, in the order given (the first freed is evicted first)."""
        for b in blocks:
            rc = self.ref_counts[b]
            if rc <= 0:
                raise RuntimeError(f"block {b} freed with ref count {rc}")
            self.ref_counts[b] = rc - 1
            if rc == 1:
                self.free_queue[b] = None
        if self.recently_freed is not None:
            self.recently_freed.update(blocks)

    def set_hash(self, block: int, h: bytes, num_tokens: int) -> None:
        """Register `block`'s first `num_tokens` slots as content `h` (a longer key replaces a shorter one).

        If another block already holds `h`, this one stays private: one block per key.
        """
        if num_tokens <= self.cached_len[block] or h in self.cached:
            return
        self.drop_hash(block)
        self.block_hash[block] = h
        self.cached_len[block] = num_tokens
        self.cached[h] = block

    def drop_hash(self, block: int) -> None:
        h = self.block_hash[block]
        if h is not None:
            self.block_hash[block] = None
            self.cached_len[block] = 0
            if self.cached.get(h) == block:
                del self.cached[h]

    def reset_cache(self) -> None:
        """Forget all cached content of free blocks (blocks in use keep theirs)."""
        for b in list(self.free_queue):
            self.drop_hash(b)

    def check_invariants(self, holders: dict[int, int]) -> None:
        """`holders[b]` = how many block tables and pins hold b (the caller counts them)."""
        for b in range(self.num_blocks):
            want = holders.get(b, 0)
            if self.ref_counts[b] != want:
                raise AssertionError(f"block {b}: ref count {self.ref_counts[b]} != {want} holders")
            if (self.ref_counts[b] == 0) != (b in self.free_queue):
                raise AssertionError(
                    f"block {b}: ref count {self.ref_counts[b]} but in_free_queue={b in self.free_queue}"
                )
        for h, b in self.cached.items():
            if self.block_hash[b] != h:
                raise AssertionError(f"cache index maps a hash to block {b}, which holds another")
