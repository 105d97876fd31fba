"""The CPU tier below the GPU prefix cache: host block slots keyed by content, least recently used evicted.

Pure bookkeeping over ids, like the rest of `kv/`: it plans copies, the runner moves the bytes
(`runner/kv_offload.py`). Every full block registered on the GPU is also planned for a host slot
(write-through), so a GPU eviction loses nothing the tier can hold; an admission whose prefix continues past
the GPU cache into the tier gets new GPU blocks loaded from their slots instead of recomputing them.

A slot is loadable only once every store into it is reported done (`stored`). A slot may be given to new
content as soon as it is evicted: the runner issues each store after every load issued before it, so a
load planned from the old content reads it first.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

from roseinfer.kv.block_pool import BlockPool


class CpuTier:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"the CPU tier needs >= 1 block slot, got {num_slots}")
        self.num_slots = num_slots
        self.slot_of: dict[bytes, int] = {}
        self.hash_of: list[bytes | None] = [None] * num_slots
        self.lru: OrderedDict[int, None] = OrderedDict()  # slots holding content, least recent first
        self.free_slots = list(range(num_slots - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self.storing: Counter[int] = Counter()  # slots with stores planned and not reported done
        self.num_stores = 0
        self.num_loads = 0
        self.num_evictions = 0

    @property
    def num_used(self) -> int:
        return len(self.lru)

    def lookup(self, h: bytes) -> int | None:
        """The slot holding content `h`, stored, if any."""
        slot = self.slot_of.get(h)
        return None if slot is None or slot in self.storing else slot

    def touch(self, slot: int) -> None:
        self.lru.move_to_end(slot)

    def reserve(self, h: bytes) -> int | None:
        """A slot for new content `h` (its store still to plan), evicting the least recently used content if
        none is free; None if the tier holds `h` already (then it counts as used now)."""
        held = self.slot_of.get(h)
        if held is not None:
            self.touch(held)
            return None
        if self.free_slots:
            slot = self.free_slots.pop()
        else:
            slot, _ = self.lru.popitem(last=False)
            old = self.hash_of[slot]
            assert old is not None
            del self.slot_of[old]
            self.num_evictions += 1
        self.hash_of[slot] = h
        self.slot_of[h] = slot
        self.lru[slot] = None
        self.storing[slot] += 1
        self.num_stores += 1
        return slot

    def stored(self, slots: list[int]) -> None:
        self.storing.subtract(slots)
        for slot in slots:
            if self.storing[slot] <= 0:
                del self.storing[slot]

    def reset(self) -> None:
        """Forget every slot's content (stores in flight still land, in slots that now hold nothing)."""
        self.slot_of.clear()
        self.hash_of = [None] * self.num_slots
        self.lru.clear()
        self.free_slots = list(range(self.num_slots - 1, -1, -1))

    def check_invariants(self) -> None:
        if len(self.lru) + len(self.free_slots) != self.num_slots:
            raise AssertionError("CPU tier: used + free slots != its size")
        for h, slot in self.slot_of.items():
            if self.hash_of[slot] != h or slot not in self.lru:
                raise AssertionError(f"CPU tier: slot {slot} is indexed for content it does not hold")
        if len(self.slot_of) != len(self.lru):
            raise AssertionError("CPU tier: a used slot holds no indexed content")


class OffloadPlan:
    """The CPU tier and the copies planned for the next launch, beside the GPU block pool it reads and fills.

    A planned store holds its GPU block (a reference, like a block table's) until the runner reports it done:
    the store reads the block after the step that fills it, and nobody may reuse the block before. A planned
    load must wait for the step in flight where its target block was freed since that step was scheduled
    (that step may still write the block); `begin_step` rolls that window."""

    def __init__(self, pool: BlockPool, num_slots: int) -> None:
        self.pool = pool
        self.tier = CpuTier(num_slots)
        self.loads: list[tuple[int, int]] = []  # (host slot, GPU block)
        self.stores: list[tuple[int, int]] = []  # (GPU block, host slot)
        self.holds: Counter[int] = Counter()  # GPU blocks held by stores not yet reported done
        self.num_loaded_blocks = 0
        self._freed_last_step: set[int] = set()
        pool.recently_freed = set()

    def load(self, slots: Sequence[int], blocks: Sequence[int]) -> None:
        for slot in slots:
            self.tier.touch(slot)
        self.loads.extend(zip(slots, blocks))
        self.tier.num_loads += len(blocks)
        self.num_loaded_blocks += len(blocks)

    def store(self, block: int, h: bytes) -> None:
        slot = self.tier.reserve(h)
        if slot is not None:
            self.pool.incref([block])
            self.holds[block] += 1
            self.stores.append((block, slot))

    def begin_step(self) -> None:
        self._freed_last_step, self.pool.recently_freed = self.pool.recently_freed or set(), set()

    def take(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]], bool]:
        """(loads, stores, whether the loads must wait for the step in flight), planned since the last call."""
        loads, stores = self.loads, self.stores
        self.loads, self.stores = [], []
        recent = self.pool.recently_freed or set()
        wait = any(b in self._freed_last_step or b in recent for _, b in loads)
        return loads, stores, wait

    def stores_done(self, pairs: Sequence[tuple[int, int]]) -> None:
        """The runner finished these (block, host slot) stores: their slots are loadable, their blocks free."""
        blocks = [b for b, _ in pairs]
        self.holds.subtract(blocks)
        self.holds += Counter()  # drop the zeros
        self.pool.free(blocks)
        self.tier.stored([s for _, s in pairs])
