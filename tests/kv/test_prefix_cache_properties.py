"""Block pool + prefix cache under random request streams with shared prefixes (no model)."""

from __future__ import annotations

import random

import pytest

from roseinfer.config import SchedulerConfig
from roseinfer.kv.block_pool import BlockPool
from roseinfer.kv.manager import KVCacheManager
from roseinfer.kv.prefix_cache import (
    ROOT,
    extend_block_hashes,
    hash_full_block,
    hash_partial_block,
    root_hash,
)
from roseinfer.request import Request, RequestStatus
from roseinfer.sampling_params import SamplingParams
from roseinfer.scheduler.policy import AdmissionPolicy
from roseinfer.scheduler.scheduler import Scheduler
from tests.scheduler.driver import Driver


def check_step(sched: Scheduler, out) -> None:
    """Invariants, plus: every block a scheduled request writes this step is private and uncached."""
    bs = sched.kv.block_size
    writers = []
    for s in out.scheduled:
        r = s.request
        for pos in range(s.start, s.start + s.num_new_tokens, 1):
            if pos == s.start or pos % bs == 0:
                writers.append((r, pos))
    sched.kv.check_invariants(sched.running, writers)
    dsts = [d for _, d in out.blocks_to_copy]
    srcs = [s for s, _ in out.blocks_to_copy]
    assert len(set(dsts)) == len(dsts) and not set(dsts) & set(srcs)


def _check_admission_dry_runs(kv: KVCacheManager) -> None:
    """Whenever `admission_fits` says yes, the admission's own allocation must succeed."""
    fits, allocate = kv.admission_fits, kv.allocate_slots
    promised: set[int] = set()

    def admission_fits(req, max_new, prefix):
        ok = fits(req, max_new, prefix)
        if ok:
            promised.add(id(req))
        return ok

    def allocate_slots(req, num_new):
        ok = allocate(req, num_new)
        if id(req) in promised:
            promised.discard(id(req))
            assert ok, f"admission_fits promised blocks that allocate_slots could not find for {req}"
        return ok

    kv.admission_fits, kv.allocate_slots = admission_fits, allocate_slots


def run_stream(seed: int, async_: bool = False) -> KVCacheManager:
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 8])
    num_blocks = rng.randint(12, 80)
    kv = KVCacheManager(num_blocks, bs, enable_prefix_caching=True)
    policy = AdmissionPolicy(rng.choice(["fcfs", "lpm", "lof"]), max_wait_steps=rng.randint(1, 10))
    sched = Scheduler(
        SchedulerConfig(rng.randint(1, 6), rng.choice([3, 8, 64]), "continuous"), kv, 10_000, policy
    )
    driver = Driver(sched, async_)
    _check_admission_dry_runs(kv)
    bases = [[rng.randint(10, 60) for _ in range(rng.randint(1, 30))] for _ in range(3)]
    pool_tokens = num_blocks * bs
    reqs, next_id = [], 0
    for _ in range(300):
        if rng.random() < 0.35 and next_id < 50:
            max_tokens = rng.randint(1, 8)
            base = rng.choice(bases)
            prompt = base[: rng.randint(1, len(base))] + [
                rng.randint(10, 60) for _ in range(rng.randint(0, 6))
            ]
            n = rng.choice([1, 1, 2, 3])
            if (len(prompt) + max_tokens) * n + bs * n > pool_tokens:
                continue
            salt = rng.choice([None, None, "t1"])
            req = Request(str(next_id), prompt, SamplingParams(max_tokens=max_tokens, n=n), cache_salt=salt)
            next_id += 1
            reqs.append(req)
            sched.add_request(req)
        if not driver.has_unfinished():
            continue
        driver.step(lambda: rng.randint(10, 60), lambda out: check_step(sched, out))
        reqs.extend(r for r in driver.got if r.parent is not None and r not in reqs)
        sched.check_invariants()
        if rng.random() < 0.05 and sched.running:
            sched._preempt(rng.choice(sched.running))
            sched.check_invariants()
    for _ in range(2000):
        if not driver.has_unfinished():
            break
        driver.step(lambda: 11, lambda out: check_step(sched, out))
        reqs.extend(r for r in driver.got if r.parent is not None and r not in reqs)
    assert not driver.has_unfinished()
    for r in reqs:
        assert r.is_finished and not r.block_ids
    assert kv.num_free_blocks == num_blocks  # all blocks back, some still cached for reuse
    assert len(kv.pool.cached) <= num_blocks
    return kv


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seed", range(30))
def test_random_shared_prefix_streams(seed, async_):
    run_stream(seed, async_)


def test_streams_actually_hit_and_copy():
    hits = sum(run_stream(s).num_hit_tokens for s in range(10))
    assert hits > 0


def test_hash_serialisation_does_not_alias():
    assert hash_full_block(ROOT, [1, 23]) != hash_full_block(ROOT, [12, 3])
    assert hash_full_block(ROOT, [1, 2]) != hash_partial_block(ROOT, [1, 2])
    assert hash_full_block(ROOT, [2**32]) != hash_full_block(ROOT, [0, 1])
    assert hash_full_block(ROOT, [256]) != hash_full_block(ROOT, [1, 0])
    # A salt is no token list: salted and unsalted chains never meet.
    assert root_hash("") != ROOT and root_hash("a") != root_hash("b")
    parent = hash_full_block(ROOT, [5, 6])
    assert hash_full_block(parent, [7, 8]) != hash_full_block(ROOT, [5, 6, 7, 8])


@pytest.mark.parametrize("seed", range(6))
def test_extending_keys_chains_hash_full_block_over_each_new_block(seed: int) -> None:
    """The keys `extend_block_hashes` appends (one serialisation, byte slices of it) are each block's
    `hash_full_block` of its parent: from nothing or from a list already part-way, for lists and arrays of ids,
    any block size, with and without a salt, with a partial block left over."""
    import numpy as np

    rng = random.Random(seed)
    block = rng.choice([1, 2, 3, 16, 32])
    tokens = [rng.randrange(0, 2**40) for _ in range(rng.randrange(0, 9 * block))]
    salt = rng.choice([None, "tenant"])
    want, parent = [], root_hash(salt)
    for i in range(len(tokens) // block):
        parent = hash_full_block(parent, tokens[i * block : (i + 1) * block])
        want.append(parent)
    whole: list[bytes] = []
    extend_block_hashes(whole, tokens, block, salt)
    assert whole == want
    done = rng.randrange(0, len(want) + 1)
    part = want[:done]
    extend_block_hashes(part, np.asarray(tokens, dtype=np.int64), block, salt)
    assert part == want
    extend_block_hashes(part, tokens, block, salt)  # nothing new: nothing appended
    assert part == want


def test_salted_requests_never_hit_each_other():
    kv = KVCacheManager(32, 2)
    sched = Scheduler(SchedulerConfig(4, 64), kv, 10_000)
    prompt = [5, 6, 7, 8, 9]

    def run(salt):
        r = Request(salt or "none", prompt, SamplingParams(max_tokens=1), cache_salt=salt)
        sched.add_request(r)
        while sched.has_unfinished():
            out = sched.schedule()
            sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
        return r.num_cached_tokens

    assert [run("a"), run("b"), run(None), run("a")] == [0, 0, 0, 4]


def test_eviction_is_lru_and_deepest_first():
    kv = KVCacheManager(6, 2)
    sched = Scheduler(SchedulerConfig(4, 64), kv, 10_000)

    def run(rid, prompt):
        r = Request(rid, prompt, SamplingParams(max_tokens=1))
        sched.add_request(r)
        while sched.has_unfinished():
            out = sched.schedule()
            sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
        return r

    a = run("a", [1, 2, 3, 4])  # blocks for [1,2] and [3,4] stay cached after a finishes
    a_first, a_deep = 0, 1
    run("b", [5, 6, 7, 8])
    assert run("c", [9, 10, 11]).num_cached_tokens == 0  # takes the two never-used blocks
    # b2 hits all of b; recomputing its last token needs one private block: the least recently used
    # free block is a's, and of a's the deepest goes first.
    assert run("b2", [5, 6, 7, 8]).num_cached_tokens == 3
    pool = kv.pool
    assert pool.block_hash[a_deep] != a.block_hashes[1] and pool.block_hash[a_first] == a.block_hashes[0]
    assert run("a2", [1, 2, 3, 4]).num_cached_tokens == 2  # a's first block survived


def test_whole_prompt_hit_never_schedules_zero_tokens():
    kv = KVCacheManager(16, 4)
    sched = Scheduler(SchedulerConfig(4, 64), kv, 10_000)
    for rid in ("x", "y"):
        r = Request(rid, list(range(10, 18)), SamplingParams(max_tokens=2))
        sched.add_request(r)
        while sched.has_unfinished():
            out = sched.schedule()
            assert all(s.num_new_tokens >= 1 for s in out.scheduled)
            check_step(sched, out)
            sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
    assert r.num_cached_tokens == 7


def test_copies_of_one_step_are_batched():
    """W5 in miniature: identical prompts whose last block is partly filled; a batch of hits copies together."""
    kv = KVCacheManager(64, 4)
    sched = Scheduler(SchedulerConfig(4, 256), kv, 10_000)
    prompt = [3, 4, 5, 6, 7]  # one full block + one partial block
    first = Request("warm", prompt, SamplingParams(max_tokens=1))
    sched.add_request(first)
    out = sched.schedule()
    sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
    for i in range(4):
        sched.add_request(Request(str(i), prompt, SamplingParams(max_tokens=2)))
    out = sched.schedule()
    assert len(out.scheduled) == 4 and all(s.num_new_tokens == 1 for s in out.scheduled)
    assert len(out.blocks_to_copy) == 4  # four private copies of the shared partial block, one batch
    assert len({src for src, _ in out.blocks_to_copy}) == 1
    check_step(sched, out)


def test_lpm_prefers_hits_but_ages_cold_requests():
    kv = KVCacheManager(256, 4)
    policy = AdmissionPolicy("lpm", max_wait_steps=3)
    sched = Scheduler(SchedulerConfig(1, 64), kv, 10_000, policy)
    warm_prompt = list(range(10, 30))
    r0 = Request("seed", warm_prompt, SamplingParams(max_tokens=1))
    sched.add_request(r0)
    out = sched.schedule()
    sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
    cold = Request("cold", list(range(100, 120)), SamplingParams(max_tokens=1))
    sched.add_request(cold)
    admitted = []
    for i in range(8):
        sched.add_request(Request(f"warm{i}", warm_prompt + [i], SamplingParams(max_tokens=1)))
    while sched.has_unfinished():
        out = sched.schedule()
        admitted += [
            s.request.request_id
            for s in out.scheduled
            if not s.request.output_token_ids and s.request.request_id not in admitted
        ]
        sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
    assert admitted[0] == "warm0"  # a hit goes ahead of the older cold request
    assert admitted.index("cold") <= 3  # but the cold one is admitted once it has waited 3 steps
    assert cold.status == RequestStatus.FINISHED_LENGTH


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_identical_prompts_admitted_together_share_full_blocks(mode):
    """W4 in miniature: a batch of identical prompts computes the shared full blocks once, in one step."""
    kv = KVCacheManager(128, 4)
    sched = Scheduler(SchedulerConfig(8, 1024, mode), kv, 10_000)
    prompt = list(range(10, 27))  # 4 full blocks + 1 token
    reqs = [Request(str(i), prompt, SamplingParams(max_tokens=2)) for i in range(5)]
    for r in reqs:
        sched.add_request(r)
    out = sched.schedule()
    check_step(sched, out)
    assert [s.num_new_tokens for s in out.scheduled] == [17, 1, 1, 1, 1]
    assert all(r.block_ids[:4] == reqs[0].block_ids[:4] for r in reqs)
    assert not out.blocks_to_copy  # nothing fresh is ever a copy source
    sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
    while sched.has_unfinished():
        out = sched.schedule()
        check_step(sched, out)
        sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
    assert [r.num_cached_tokens for r in reqs] == [0, 16, 16, 16, 16]


def test_same_step_hit_never_writes_into_a_fresh_block():
    kv = KVCacheManager(64, 4)
    sched = Scheduler(SchedulerConfig(8, 1024), kv, 10_000)
    prompt = list(range(10, 26))  # exactly 4 full blocks: a whole-prompt hit would recompute inside block 3
    a, b = (
        Request("a", prompt, SamplingParams(max_tokens=1)),
        Request("b", prompt, SamplingParams(max_tokens=1)),
    )
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    check_step(sched, out)
    assert [s.num_new_tokens for s in out.scheduled] == [16, 4]  # b recomputes the last block itself
    assert b.block_ids[:3] == a.block_ids[:3] and b.block_ids[3] != a.block_ids[3]


def test_n_samples_take_their_seats_at_admission():
    kv = KVCacheManager(128, 4)
    sched = Scheduler(SchedulerConfig(4, 1024), kv, 10_000)
    for i in range(3):
        sched.add_request(Request(str(i), [5 + i, 6, 7], SamplingParams(max_tokens=3, n=2)))
    while sched.has_unfinished():
        out = sched.schedule()
        assert len(sched.running) <= 4
        sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
        assert len(sched.running) <= 4


def test_failed_admission_leaves_the_lru_order_alone():
    """A head-of-queue request that does not fit must not refresh its cached prefix blocks in the LRU."""
    kv = KVCacheManager(10, 4, enable_prefix_caching=True)
    sched = Scheduler(SchedulerConfig(8, 64, "continuous"), kv, 10_000)
    a = Request("a", list(range(10, 18)), SamplingParams(max_tokens=1))  # 2 full blocks, cached after
    sched.add_request(a)
    out = sched.schedule()
    sched.update_from_output(out, [[1]])
    assert a.is_finished
    d = Request("d", list(range(30, 34)), SamplingParams(max_tokens=1))  # freed after a: more recent
    sched.add_request(d)
    out = sched.schedule()
    sched.update_from_output(out, [[1]])
    assert d.is_finished
    b = Request("b", list(range(50, 70)), SamplingParams(max_tokens=8, ignore_eos=True))  # holds 5-6 blocks
    sched.add_request(b)
    out = sched.schedule()
    sched.update_from_output(out, [[1]])
    cached_a = [blk for blk in kv.find_cached_prefix(Request("q", a.prompt_token_ids, a.params))[0]]
    assert len(cached_a) == 2 and all(kv.pool.ref_counts[blk] == 0 for blk in cached_a)
    c = Request("c", a.prompt_token_ids + list(range(80, 100)), SamplingParams(max_tokens=1))  # needs 7
    sched.add_request(c)
    before = list(kv.pool.free_queue)
    out = sched.schedule()  # b decodes; c does not fit
    assert c in sched.waiting and [s.request for s in out.scheduled] == [b]
    after = list(kv.pool.free_queue)
    assert after == [blk for blk in before if blk in after], "the free queue was reordered"
    assert set(cached_a) <= set(after)
    sched.update_from_output(out, [[1]])
    sched.check_invariants()


def step_leaving_the_lru_order(sched: Scheduler, kv: KVCacheManager, runs: Request, waits: Request) -> None:
    """One step that schedules `runs` alone and leaves `waits` waiting without reordering the free queue."""
    before = list(kv.pool.free_queue)
    out = sched.schedule()
    assert [s.request for s in out.scheduled] == [runs] and waits in sched.waiting
    after = list(kv.pool.free_queue)
    assert after == [blk for blk in before if blk in after], "the free queue was reordered"
    sched.update_from_output(out, [[1]])


def test_a_prompt_over_the_left_budget_leaves_the_lru_order_alone():
    """Chunked prefill off: a request whose prompt does not fit what is left of the step's budget waits. It
    was admitted first and rolled back, which moved its cached prefix blocks to the most recently used end
    of the free queue, behind blocks freed after them."""
    kv = KVCacheManager(16, 4)
    sched = Scheduler(SchedulerConfig(8, 8, "continuous", enable_chunked_prefill=False), kv, 10_000)

    def run(req):
        sched.add_request(req)
        out = sched.schedule()
        sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
        assert req.is_finished

    a = Request("a", list(range(10, 18)), SamplingParams(max_tokens=1))  # 2 full blocks, cached after
    run(a)
    run(Request("d", list(range(30, 34)), SamplingParams(max_tokens=1)))  # freed after a's
    x = Request("x", list(range(50, 56)), SamplingParams(max_tokens=4))  # takes 6 of the budget of 8
    c = Request("c", a.prompt_token_ids + [90, 91, 92], SamplingParams(max_tokens=1))  # 3 to compute
    sched.add_request(x)
    sched.add_request(c)
    step_leaving_the_lru_order(sched, kv, runs=x, waits=c)
    sched.check_invariants()


def test_a_static_batch_member_that_does_not_fit_whole_leaves_the_lru_order_alone():
    """A static batch admits a member only while every member's whole prompt fits. With a budget below the
    prompts, the check came after the admission: its rollback moved the member's cached prefix blocks to
    the most recently used end of the free queue."""
    kv = KVCacheManager(8, 4)
    sched = Scheduler(SchedulerConfig(8, 20, "static"), kv, 10_000)

    def run(req=None):
        if req is not None:
            sched.add_request(req)
        for _ in range(20):
            if not sched.has_unfinished():
                return
            out = sched.schedule()
            sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
        raise AssertionError("did not finish")

    a = Request("a", list(range(10, 18)), SamplingParams(max_tokens=1))  # 2 full blocks, cached after
    run(a)
    run(Request("d", list(range(30, 34)), SamplingParams(max_tokens=1)))  # freed after a's
    x = Request("x", list(range(50, 66)), SamplingParams(max_tokens=4))  # 4 blocks
    c = Request("c", a.prompt_token_ids + list(range(70, 82)), SamplingParams(max_tokens=1))  # 5, 2 cached
    sched.add_request(x)
    sched.add_request(c)
    step_leaving_the_lru_order(sched, kv, runs=x, waits=c)
    run()
    assert c.num_cached_tokens == 8


# -- block pool and manager units: each test below killed a mutant that the stream tests let live ----------


def finish_alone(sched: Scheduler, req: Request) -> Request:
    """Run `req` to its end on its own (it must be the only request), sampling token 1."""
    sched.add_request(req)
    while sched.has_unfinished():
        out = sched.schedule()
        sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
    return req


def test_pool_refuses_an_empty_pool_and_a_double_free() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)
    pool = BlockPool(1)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(RuntimeError, match="ref count 0"):
        pool.free([b])
    assert pool.ref_counts[b] == 0 and list(pool.free_queue) == [b]


def test_a_block_keeps_its_longest_key_until_reallocation_forgets_it() -> None:
    pool = BlockPool(1)
    (b,) = pool.allocate(1)
    full, partial = hash_full_block(ROOT, [1, 2, 3, 4]), hash_partial_block(ROOT, [1, 2])
    pool.set_hash(b, partial, 2)
    pool.set_hash(b, full, 4)  # a longer key replaces a shorter one...
    assert pool.cached == {full: b} and pool.cached_len[b] == 4
    pool.set_hash(b, partial, 2)  # ...never the other way round
    assert pool.cached == {full: b} and pool.cached_len[b] == 4
    pool.free([b])
    assert pool.cached == {full: b}  # a free block stays findable
    assert pool.allocate(1) == [b]  # handing it out again evicts its content, its cached length too
    assert pool.cached == {} and pool.block_hash[b] is None and pool.cached_len[b] == 0
    assert pool.num_evictions == 1
    pool.set_hash(b, partial, 2)  # so new content of any length can be keyed
    assert pool.cached == {partial: b} and pool.cached_len[b] == 2


def test_reset_cache_forgets_free_blocks_only() -> None:
    pool = BlockPool(2)
    free, held = pool.allocate(2)
    h_free, h_held = hash_full_block(ROOT, [1]), hash_full_block(ROOT, [2])
    pool.set_hash(free, h_free, 1)
    pool.set_hash(held, h_held, 1)
    pool.free([free])
    pool.reset_cache()
    assert pool.cached == {h_held: held} and pool.block_hash[free] is None and pool.cached_len[free] == 0
    pool.check_invariants({held: 1})
    pool.cached[h_free] = held  # a stale index entry: the check must see it
    with pytest.raises(AssertionError, match="cache index"):
        pool.check_invariants({held: 1})


def test_usage_counts_held_blocks() -> None:
    kv = KVCacheManager(4, 2)
    assert kv.usage() == 0.0
    kv.pool.allocate(1)
    assert kv.usage() == 0.25


def test_a_cached_prefix_is_token_exact_and_contiguous() -> None:
    kv = KVCacheManager(16, 4)
    sched = Scheduler(SchedulerConfig(4, 64), kv, 10_000)
    prompt = list(range(10, 20))  # 2 full blocks + a partial block of 2
    finish_alone(sched, Request("a", prompt, SamplingParams(max_tokens=1)))

    def hit(tokens: list[int]) -> int:
        return kv.find_cached_prefix(Request("q", tokens, SamplingParams(max_tokens=1)))[1]

    assert hit(prompt) == 10
    assert hit(prompt[:-1] + [99]) == 8  # the partial block's last token differs
    assert hit(prompt[:-1]) == 8 and hit(prompt + [99]) == 8  # a partial key covers exactly its tokens
    blocks, _ = kv.find_cached_prefix(Request("q", prompt, SamplingParams(max_tokens=1)))
    kv.pool.drop_hash(blocks[1])  # the middle block is evicted: the partial block after it is unreachable
    assert kv.find_cached_prefix(Request("q", prompt, SamplingParams(max_tokens=1))) == (blocks[:1], 4)


def test_pins_hold_full_blocks_and_count_what_they_leave_open() -> None:
    kv = KVCacheManager(8, 4)
    sched = Scheduler(SchedulerConfig(4, 64), kv, 10_000)
    prefix = list(range(10, 18))  # 2 full blocks
    finish_alone(sched, Request("warm", prefix + [30, 31], SamplingParams(max_tokens=1)))  # + a partial one

    def req(tokens: list[int]) -> Request:
        return Request("q", tokens, SamplingParams(max_tokens=1))

    assert kv.blocks_open_to(req([1, 2, 3])) == 8
    assert kv.pin(req(prefix + [30, 31])) == 8  # its cached partial block is not pinned
    pinned = set(kv.pool.pinned)
    assert len(pinned) == 2 and all(kv.pool.ref_counts[b] == 1 for b in pinned)
    assert kv.pin(req(prefix)) == 8  # pinning again reports the whole pinned prefix, adding no reference
    assert kv.pool.pinned == pinned and all(kv.pool.ref_counts[b] == 1 for b in pinned)
    assert kv.blocks_open_to(req([1, 2, 3])) == 6
    assert kv.blocks_open_to(req(prefix + [1, 2])) == 8  # reads both pinned blocks in place
    assert kv.blocks_open_to(req(prefix)) == 7  # recomputes its last token: copies the second pinned block
    sched.check_invariants()


def test_a_block_completed_after_a_partial_hit_is_registered() -> None:
    """b hits a's full block and cached partial block; the copy of the partial block that b fills with its
    output must be keyed, so that c (b's prompt + output) hits it once a's blocks are gone."""
    kv = KVCacheManager(16, 4)
    sched = Scheduler(SchedulerConfig(4, 64), kv, 10_000)
    prompt = [5, 6, 7, 8, 9]
    finish_alone(sched, Request("a", prompt, SamplingParams(max_tokens=1)))
    b = finish_alone(sched, Request("b", prompt, SamplingParams(max_tokens=4, ignore_eos=True)))
    assert b.num_cached_tokens == 4
    c = finish_alone(sched, Request("c", b.all_token_ids[:8] + [99], SamplingParams(max_tokens=1)))
    assert c.num_cached_tokens == 8


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_blocks_filled_by_generated_tokens_are_registered(async_: bool) -> None:
    """With async scheduling a block's last token is still pending when the step that fills it is scheduled:
    it is registered once that token is known (register_computed), so the next turn hits it."""
    kv = KVCacheManager(16, 4)
    sched = Scheduler(SchedulerConfig(4, 64), kv, 10_000)
    driver = Driver(sched, async_)
    # The 4th output, a's last token fed to the model, fills block 1: no later step registers it.
    a = Request("a", [5, 6, 7, 8], SamplingParams(max_tokens=5, ignore_eos=True))
    sched.add_request(a)
    while driver.has_unfinished():
        driver.step(lambda: 11)
    assert a.num_output_tokens == 5
    turn2 = Request("b", a.all_token_ids[:8] + [99], SamplingParams(max_tokens=1))
    assert kv.find_cached_prefix(turn2)[1] == 8


@pytest.mark.parametrize("fork", [False, True], ids=["hit", "fork"])
def test_blocks_read_in_place_this_step_stay_copy_sources(fork: bool) -> None:
    """Only blocks filled by this step are fresh (recomputed rather than copied by a same-step hit). Blocks a
    request merely reads, as a hit or as an n > 1 fork, are not: a request admitted later in the step that
    writes into one copies it and computes one token."""
    kv = KVCacheManager(32, 4)
    sched = Scheduler(SchedulerConfig(8, 64), kv, 10_000)
    prompt = list(range(10, 18))  # 2 full blocks
    if fork:
        reader = Request("fork", prompt, SamplingParams(max_tokens=3, n=2, ignore_eos=True))
        sched.add_request(reader)
        out = sched.schedule()  # the prefill: its blocks are fresh in this step only
        sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
        assert len(sched.running) == 2  # the fork reads the parent's blocks from the next step on
    else:
        finish_alone(sched, Request("warm", prompt, SamplingParams(max_tokens=1)))
        sched.add_request(Request("hit", prompt, SamplingParams(max_tokens=1)))  # reads block 0 in place
    head = Request("head", prompt[:4], SamplingParams(max_tokens=1))  # its one block is a hit it writes into
    sched.add_request(head)
    out = sched.schedule()
    check_step(sched, out)
    assert [s.num_new_tokens for s in out.scheduled if s.request is head] == [1]
    assert head.num_cached_tokens == 3


def test_lpm_serves_overdue_requests_first_come_first_served() -> None:
    policy = AdmissionPolicy("lpm", max_wait_steps=2)
    reqs = {rid: Request(rid, [1, 2, 3], SamplingParams(max_tokens=1)) for rid in ("older", "newer", "hot")}
    reqs["older"].enqueued_step, reqs["newer"].enqueued_step, reqs["hot"].enqueued_step = 0, 1, 5
    hits = {"older": 0, "newer": 50, "hot": 100}
    waiting = [reqs["newer"], reqs["older"], reqs["hot"]]  # e.g. `newer` came back from a preemption
    got = policy.order(waiting, lambda r: hits[r.request_id], step=5)
    assert [r.request_id for r in got] == ["older", "newer", "hot"]


def test_lpm_ages_requests_from_when_they_arrived() -> None:
    """A request's age counts from its arrival, not from the scheduler's start: requests arriving late in
    the scheduler's life are still ranked by their hits."""
    kv = KVCacheManager(64, 4)
    sched = Scheduler(SchedulerConfig(1, 64), kv, 10_000, AdmissionPolicy("lpm", max_wait_steps=2))
    warm_prompt = list(range(10, 30))
    finish_alone(sched, Request("warm", warm_prompt, SamplingParams(max_tokens=4, ignore_eos=True)))
    assert sched.num_steps >= 2
    sched.add_request(Request("cold", list(range(100, 120)), SamplingParams(max_tokens=1)))
    sched.add_request(Request("hot", warm_prompt + [7], SamplingParams(max_tokens=1)))
    out = sched.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["hot"]


def test_every_sample_of_an_n_request_reports_the_prompt_hit() -> None:
    kv = KVCacheManager(32, 4)
    sched = Scheduler(SchedulerConfig(4, 64), kv, 10_000)
    prompt = list(range(10, 19))  # 2 full blocks + a partial block of 1
    finish_alone(sched, Request("warm", prompt, SamplingParams(max_tokens=1)))
    parent = Request("p", prompt, SamplingParams(max_tokens=2, n=2, ignore_eos=True))
    sched.add_request(parent)
    samples = [parent]
    while sched.has_unfinished():
        out = sched.schedule()
        got, _ = sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
        samples += [r for r in got if r.parent is parent and r not in samples]
    assert [r.num_cached_tokens for r in samples] == [8, 8]
