"""Per-request block tables on top of the block pool: prefix reuse, copy-on-write, registration, free.

Write rule (invariant 3): a request writes into block `b` only if it holds the sole reference and `b`
holds no cached content (cached blocks are immutable, a partly filled one too, so that its key stays
valid for later identical prompts); otherwise the block is first copied to a private block. The copies
of one step are collected here and executed by the runner in one batched launch.

One deliberate exception: a full block is registered as soon as the step that fills it is scheduled
("fresh"), so requests admitted in the same step can already read it: each layer stores the step's K/V
before it attends. A fresh block is never a copy source (its content does not exist yet when the
step's copies run), so a hit never makes a request write into one.

With a CPU tier (`kv/offload.py`) every registered full block is also planned for a host slot, and is held by
that store until the runner reports it done; an admission continues its cached prefix from the tier, into new
blocks loaded before the step's forward (never the block it writes first, so a loaded block is never written).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from roseinfer.kv.block_pool import BlockPool
from roseinfer.kv.block_tables import BlockTables
from roseinfer.kv.offload import CpuTier, OffloadPlan
from roseinfer.kv.prefix_cache import extend_block_hashes, hash_partial_block, root_hash
from roseinfer.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        num_cpu_blocks: int = 0,
        gpu_prefix_reuse: bool = True,
    ) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        if num_cpu_blocks and not enable_prefix_caching:
            raise ValueError(
                "the CPU tier is keyed by the prefix cache's block hashes: it needs prefix caching on"
            )
        # False: prefixes are reused from the CPU tier only (the GPU cache as if always thrashed; a benchmark case).
        self.gpu_prefix_reuse = gpu_prefix_reuse
        self.pool = BlockPool(num_blocks)
        self.tables = BlockTables()  # every change to a request's block_ids is mirrored here
        self.pending_copies: list[tuple[int, int]] = []
        self._pending_free: list[int] = []  # copy sources: released after the step's copies are issued
        self.fresh: set[int] = set()  # full blocks registered this step, filled by this step's forward
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        self.offload = OffloadPlan(self.pool, num_cpu_blocks) if num_cpu_blocks else None

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def cpu(self) -> CpuTier | None:
        return self.offload.tier if self.offload is not None else None

    @property
    def num_loaded_tokens(self) -> int:
        """Prefix tokens loaded from the CPU tier rather than computed."""
        return self.offload.num_loaded_blocks * self.block_size if self.offload is not None else 0

    @property
    def store_holds(self) -> Counter[int]:
        return self.offload.holds if self.offload is not None else Counter()

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    def usage(self) -> float:
        return 1.0 - self.pool.num_free / self.pool.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # -- prefix lookup ------------------------------------------------------------------------------

    def _hashes(self, req: Request) -> list[bytes]:
        extend_block_hashes(req.block_hashes, req.all_token_ids, self.block_size, req.cache_salt)
        return req.block_hashes

    def _partial_key(self, req: Request, num_tokens: int) -> bytes:
        full = num_tokens // self.block_size
        parent = req.block_hashes[full - 1] if full else root_hash(req.cache_salt)
        return hash_partial_block(parent, req.all_token_ids[full * self.block_size : num_tokens])

    def find_cached_prefix(self, req: Request) -> tuple[list[int], int]:
        """Blocks holding the longest cached prefix of the request's tokens, and its length in tokens; none
        for a request still to compute prompt logprobs (as vLLM v1), which needs every position's logits."""
        if not (self.enable_prefix_caching and self.gpu_prefix_reuse) or req.needs_prompt_logprobs:
            return [], 0
        cached = self.pool.cached
        blocks = []
        for h in self._hashes(req):
            b = cached.get(h)
            if b is None:
                break
            blocks.append(b)
        num_tokens = len(blocks) * self.block_size
        known = len(req.all_token_ids)  # a pending token's id is not known: it cannot be looked up
        if len(blocks) == len(req.block_hashes) and num_tokens < known:
            b = cached.get(self._partial_key(req, known))
            if b is not None:
                blocks.append(b)
                num_tokens = known
        return blocks, num_tokens

    def _first_write(self, req: Request, hit: int) -> int:
        """Index of the block a request with `hit` cached tokens writes first (at least its last token is
        computed); a hit block there or after is copied, not shared."""
        return self.admitted_start(req, hit) // self.block_size

    def usable_prefix(self, req: Request) -> tuple[list[int], int]:
        """The cached prefix `admit` would attach, and its length in tokens: a fresh block (filled by this
        step) in the position the request writes first is recomputed, since a fresh block is never copied."""
        blocks, hit = self.find_cached_prefix(req)
        write = self._first_write(req, hit)
        if write < len(blocks) and blocks[write] in self.fresh:
            blocks, hit = blocks[:write], write * self.block_size
        return blocks, hit

    def prefix_without_copy(self, req: Request, prefix: tuple[list[int], int]) -> tuple[list[int], int]:
        """`prefix` less the hit block the request writes first (it would have to copy it)."""
        blocks, hit = prefix
        write = self._first_write(req, hit)
        return (blocks[:write], write * self.block_size) if write < len(blocks) else prefix

    def blocks_open_to(self, req: Request) -> int:
        """Blocks the request could ever hold: the pool less the pinned blocks (never freed), except the
        pinned blocks of its own cached prefix that it reads without copying."""
        if not self.pool.pinned:
            return self.num_blocks
        blocks, hit = self.find_cached_prefix(req)
        shared = sum(b in self.pool.pinned for b in blocks[: self._first_write(req, hit)])
        return self.num_blocks - len(self.pool.pinned) + shared

    def cpu_hit(self, req: Request, prefix: tuple[list[int], int]) -> list[int]:
        """Host slots continuing `prefix` (a GPU prefix of whole blocks) block by block from the CPU tier, up to
        the block holding the last token, which is computed (and may be written)."""
        blocks, hit = prefix
        if self.cpu is None or req.needs_prompt_logprobs or hit != len(blocks) * self.block_size:
            return []
        hashes = self._hashes(req)
        slots = []
        for i in range(len(blocks), min(len(hashes), (req.num_tokens - 1) // self.block_size)):
            slot = self.cpu.lookup(hashes[i])
            if slot is None:
                break
            slots.append(slot)
        return slots

    def admit(
        self, req: Request, prefix: tuple[list[int], int] | None = None, cpu_slots: Sequence[int] = ()
    ) -> int:
        """Attach the cached prefix (`usable_prefix`, unless given), then its continuation from the CPU tier
        (`cpu_hit`) in new blocks, to a request entering the running set; returns the hit in tokens. At least
        the last token is always left to compute: its logits are needed.
        """
        assert not req.block_ids
        blocks, hit = prefix if prefix is not None else self.usable_prefix(req)
        self.pool.incref(blocks)
        req.block_ids = list(blocks)
        if cpu_slots:
            assert self.offload is not None and hit == len(blocks) * self.block_size
            loaded = self.pool.allocate(len(cpu_slots))
            for i, block in enumerate(loaded, start=len(blocks)):
                self.pool.set_hash(block, req.block_hashes[i], self.block_size)
            self.offload.load(cpu_slots, loaded)
            req.block_ids += loaded
            hit += len(loaded) * self.block_size
        self.tables.write(req, 0, req.block_ids)
        req.num_computed_tokens = self.admitted_start(req, hit)
        req.num_registered_blocks = min(len(req.block_ids), req.num_computed_tokens // self.block_size)
        return hit

    @staticmethod
    def admitted_start(req: Request, hit: int) -> int:
        """Where `admit` leaves a request with a hit of `hit` tokens: the last token is always computed."""
        return min(hit, req.num_tokens - 1)

    def admission_fits(
        self, req: Request, max_new_tokens: int, prefix: tuple[list[int], int], reserved: int = 0
    ) -> bool:
        """Dry run of `admit(req, prefix)` + `allocate_slots` for up to `max_new_tokens`: would the pool
        have the blocks, beside `reserved` free ones promised elsewhere? Asking first spares a failed
        admission its rollback, which would move the request's cached blocks to the most recently used end
        of the free queue."""
        blocks, hit = prefix
        start = self.admitted_start(req, hit)
        end = start + min(req.num_tokens - start, max_new_tokens)
        revived = sum(1 for b in blocks if self.pool.ref_counts[b] == 0)  # leave the free queue on a hit
        need = max(0, self.blocks_for(end) - len(blocks))
        # Hit blocks are cached, so a write into one of them is always a copy.
        copies = max(0, min(len(blocks), cdiv(end, self.block_size)) - start // self.block_size)
        return need + copies + reserved <= self.pool.num_free - revived

    def count_query(self, num_tokens: int, hit: int) -> None:
        if self.enable_prefix_caching:
            self.num_queried_tokens += num_tokens
            self.num_hit_tokens += hit

    # -- allocation -------------------------------------------------------------------------------

    def _must_copy(self, block: int) -> bool:
        return self.pool.ref_counts[block] > 1 or self.pool.block_hash[block] is not None

    def _owns_past_cached(self, block: int, offset: int) -> bool:
        """The writer holds `block` alone and writes from slot `offset` on, past its cached slots (its own
        partial prompt block): an in-place write leaves the cached content, hence its key, valid."""
        return self.pool.ref_counts[block] == 1 and offset >= self.pool.cached_len[block]

    def allocate_slots(self, req: Request, num_new_tokens: int) -> bool:
        """Make `num_new_tokens` slots after `num_computed_tokens` writable; False (nothing changed) if full."""
        bs = self.block_size
        start, end = req.num_computed_tokens, req.num_computed_tokens + num_new_tokens
        table = req.block_ids
        offset, index = start % bs, start // bs
        if offset and num_new_tokens <= bs - offset and index < len(table):
            block = table[index]
            if self.pool.ref_counts[block] == 1 and self.pool.block_hash[block] is None:
                return True  # the common decode step: one more slot in a private, already allocated block
        first, last = start // bs, min(len(table), cdiv(end, bs))
        cow = [i for i in range(first, last) if self._must_copy(table[i])]
        need = max(0, self.blocks_for(end) - len(table))
        if need + len(cow) > self.pool.num_free and cow and cow[0] == first:
            # No block for the copy: a block it owns past its cached slots is written in place instead (else
            # a request filling the pool preempts itself, and under a small budget re-registers it forever).
            if self._owns_past_cached(table[first], offset):
                cow = cow[1:]
        if need + len(cow) > self.pool.num_free:
            return False
        for i in cow:
            src, (dst,) = table[i], self.pool.allocate(1)
            self.pending_copies.append((src, dst))
            self._pending_free.append(src)
            table[i] = dst
            self.tables.set(req, i, dst)
        if need:
            new = self.pool.allocate(need)
            self.tables.write(req, len(table), new)
            table.extend(new)
        return True

    def take_copies(self) -> list[tuple[int, int]]:
        """The step's (src, dst) copies; their sources are released only now, so no block is both."""
        copies, self.pending_copies = self.pending_copies, []
        self.pool.free(self._pending_free)
        self._pending_free = []
        return copies

    def begin_step(self) -> None:
        self.fresh.clear()
        if self.offload is not None:
            self.offload.begin_step()

    # Both registrations are asked for every scheduled request on every step, and most steps complete no
    # block: they test that before calling on.
    def register_scheduled(self, req: Request, num_new_tokens: int) -> None:
        """Register the full blocks this step completes for `req` (which is scheduled for sure)."""
        num_tokens = req.num_computed_tokens + num_new_tokens
        if self.enable_prefix_caching and num_tokens // self.block_size > req.num_registered_blocks:
            self._register(req, num_tokens, fresh=True)

    def register_computed(self, req: Request) -> None:
        """Register full blocks that were computed (or are being, by a launched step) but could not be
        keyed when scheduled, because their last token was still pending then."""
        if (
            self.enable_prefix_caching
            and req.num_computed_tokens // self.block_size > req.num_registered_blocks
        ):
            self._register(req, req.num_computed_tokens, fresh=False)

    def _register(self, req: Request, num_tokens: int, fresh: bool) -> None:
        """Register the full blocks of `req`'s first `num_tokens` tokens past those already registered."""
        full = num_tokens // self.block_size
        hashes = self._hashes(req)  # full blocks of known tokens only
        full = min(full, len(hashes))
        for i in range(req.num_registered_blocks, full):
            block = req.block_ids[i]
            self.pool.set_hash(block, hashes[i], self.block_size)
            if self.pool.block_hash[block] == hashes[i]:  # else another block holds it (and planned its store)
                if fresh:
                    self.fresh.add(block)
                if self.offload is not None:
                    self.offload.store(block, hashes[i])
        req.num_registered_blocks = max(req.num_registered_blocks, full)

    # -- CPU tier -----------------------------------------------------------------------------------

    def take_offload(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]], bool]:
        assert self.offload is not None
        return self.offload.take()

    def stores_done(self, pairs: Sequence[tuple[int, int]]) -> None:
        assert self.offload is not None
        self.offload.stores_done(pairs)

    def reset_prefix_cache(self) -> None:
        """Forget the cached content of every free GPU block and of the whole CPU tier."""
        self.pool.reset_cache()
        if self.cpu is not None:
            self.cpu.reset()

    def on_prompt_computed(self, req: Request) -> None:
        """Register the partly filled last prompt block once its KV exists: identical prompts and n > 1
        samples share it (a partial block is never registered early: sharers copy it before writing)."""
        bs, k = self.block_size, req.num_prompt_tokens
        if not self.enable_prefix_caching or k % bs == 0:
            return
        self._hashes(req)
        self.pool.set_hash(req.block_ids[k // bs], self._partial_key(req, k), k % bs)

    def free(self, req: Request) -> None:
        # Deepest block first: it is the least likely to be shared, so it should be evicted first.
        self.pool.free(list(reversed(req.block_ids)))
        self.tables.release(req, len(req.block_ids))
        req.block_ids = []
        req.num_registered_blocks = 0

    def fork(self, parent: Request, child: Request) -> None:
        """`child` shares every block of `parent` (n > 1 samples of one prompt)."""
        self.pool.incref(parent.block_ids)
        child.block_ids = list(parent.block_ids)
        self.tables.write(child, 0, child.block_ids)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_registered_blocks = parent.num_registered_blocks
        child.block_hashes = list(parent.block_hashes)

    # -- pins ---------------------------------------------------------------------------------------

    def pin(self, req: Request) -> int:
        """Pin the cached full blocks of `req`'s tokens so they are never evicted; returns tokens pinned."""
        blocks, _ = self.find_cached_prefix(req)
        blocks = blocks[: req.num_tokens // self.block_size]
        new = [b for b in blocks if b not in self.pool.pinned]
        self.pool.incref(new)
        self.pool.pinned.update(new)
        return len(blocks) * self.block_size

    # -- checks -------------------------------------------------------------------------------------

    def check_invariants(
        self, requests: Iterable[Request], writers: Sequence[tuple[Request, int]] = ()
    ) -> None:
        """Conservation, ref counts = holders, free queue = unreferenced; `writers` (request, first write
        position in each block it writes) must hold their write blocks alone, each block written by one."""
        requests = list(requests)
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
        for b, n in self.store_holds.items():
            holders[b] = holders.get(b, 0) + n
        if self.cpu is not None:
            self.cpu.check_invariants()
        self.pool.check_invariants(holders)
        self.tables.check(requests)
        held = sum(1 for rc in self.pool.ref_counts if rc > 0)
        if held + self.pool.num_free != self.pool.num_blocks:
            raise AssertionError("conservation: held + free != pool size")
        # Spelled out rather than asked of `_must_copy`, which is what this checks.
        rc, cached, cached_len = self.pool.ref_counts, self.pool.block_hash, self.pool.cached_len
        writer: dict[int, Request] = {}
        for req, pos in writers:
            b = req.block_ids[pos // self.block_size]
            if writer.setdefault(b, req) is not req:
                raise AssertionError(f"{req} and {writer[b]} both write block {b} in one step")
            if (
                (rc[b] > 1 or cached[b] is not None)
                and b not in self.fresh
                and not (rc[b] == 1 and pos % self.block_size >= cached_len[b])
            ):
                raise AssertionError(f"{req} writes block {b} that others can read")
