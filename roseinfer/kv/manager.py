"""Per-request block allocation on top of the block pool."""

from __future__ import annotations

from collections.abc import Iterable

from roseinfer.kv.block_pool import BlockPool
from roseinfer.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def usage(self) -> float:
        return 1.0 - self.pool.num_free / self.pool.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def allocate_slots(self, req: Request, num_new_tokens: int) -> bool:
        """Make room for `num_new_tokens` after `req.num_computed_tokens`; False (nothing changed) if full."""
        need = self.blocks_for(req.num_computed_tokens + num_new_tokens) - len(req.block_ids)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        req.block_ids.extend(self.pool.allocate(need))
        return True

    def free(self, req: Request) -> None:
        # Deepest block first: it is the least likely to be shared, so it should be evicted first.
        self.pool.free(list(reversed(req.block_ids)))
        req.block_ids = []

    def check_invariants(self, requests: Iterable[Request]) -> None:
        holders: dict[int, int] = {}
        for req in requests:
            if len(req.block_ids) != len(set(req.block_ids)):
                raise AssertionError(f"{req} holds a block twice")
            if len(req.block_ids) < self.blocks_for(req.num_computed_tokens):
                raise AssertionError(f"{req} has fewer blocks than its computed tokens need")
            for b in req.block_ids:
                holders[b] = holders.get(b, 0) + 1
        for b in self.pool.pinned:
            holders[b] = holders.get(b, 0) + 1
        self.pool.check_invariants(holders)
        held = sum(1 for rc in self.pool.ref_counts if rc > 0)
        if held + self.pool.num_free != self.pool.num_blocks:
            raise AssertionError("conservation: held + free != pool size")
