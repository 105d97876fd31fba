"""The CPU tier's bookkeeping (kv/offload.py), the manager's planning of its loads and stores, and the
runner's copies (runner/kv_offload.py) on the CPU."""

from __future__ import annotations

import random

import pytest
import torch

from roseinfer.config import CacheConfig
from roseinfer.kv.manager import KVCacheManager
from roseinfer.kv.offload import CpuTier
from roseinfer.request import Request
from roseinfer.runner.kv_offload import (
    KVOffloader,
    cpu_tier_num_blocks,
    last_per_target,
    slot_runs,
    staging_blocks,
)
from roseinfer.sampling_params import SamplingParams


def key(i: int) -> bytes:
    return i.to_bytes(32, "little")


def test_tier_evicts_least_recently_used_and_hides_unfinished_stores() -> None:
    tier = CpuTier(3)
    slots = [tier.reserve(key(i)) for i in range(3)]
    assert slots == [0, 1, 2] and tier.lookup(key(0)) is None  # stores not done: not loadable
    tier.stored(slots)
    assert [tier.lookup(key(i)) for i in range(3)] == [0, 1, 2]
    assert tier.reserve(key(1)) is None  # held already: now the most recently used
    tier.touch(0)
    assert tier.reserve(key(3)) == 2  # key 2 was least recently used
    assert tier.lookup(key(2)) is None and tier.lookup(key(3)) is None and tier.num_evictions == 1
    tier.stored([2])
    assert tier.lookup(key(3)) == 2
    tier.check_invariants()


def test_a_slot_stored_twice_is_loadable_only_after_both_stores() -> None:
    tier = CpuTier(1)
    assert tier.reserve(key(0)) == 0
    assert tier.reserve(key(1)) == 0  # evicts key 0 while its store is in flight
    tier.stored([0])
    assert tier.lookup(key(1)) is None
    tier.stored([0])
    assert tier.lookup(key(1)) == 0
    tier.reset()
    assert tier.lookup(key(1)) is None and tier.num_used == 0
    tier.check_invariants()


def test_tier_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="slot"):
        CpuTier(0)


def request(tokens: list[int]) -> Request:
    return Request("r", tokens, SamplingParams(max_tokens=4, ignore_eos=True))


def test_manager_stores_registered_blocks_and_loads_the_continuation() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4, num_cpu_blocks=8)
    first = request(list(range(10, 23)))  # 13 tokens: 3 full blocks
    kv.admit(first)
    assert kv.allocate_slots(first, 13)
    kv.register_scheduled(first, 13)
    loads, stores, _ = kv.take_offload()
    assert loads == [] and [b for b, _ in stores] == first.block_ids[:3]
    assert all(kv.pool.ref_counts[b] == 2 for b, _ in stores)  # held by the request and its store
    kv.free(first)
    assert kv.cpu is not None and kv.cpu.lookup(first.block_hashes[0]) is None  # store not done yet
    kv.stores_done(stores)
    assert kv.num_free_blocks == 8 and not kv.store_holds
    assert [kv.cpu.lookup(h) for h in first.block_hashes] == [s for _, s in stores]
    kv.reset_prefix_cache()
    assert [kv.cpu.lookup(h) for h in first.block_hashes] == [None] * 3 and not kv.pool.cached


def test_admission_loads_up_to_the_block_it_writes_first() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4, num_cpu_blocks=16, gpu_prefix_reuse=False)
    tokens = list(range(10, 22))  # 12 tokens: 3 full blocks
    first = request(tokens)
    kv.admit(first)
    kv.allocate_slots(first, 12)
    kv.register_scheduled(first, 12)
    _, stores, _ = kv.take_offload()
    kv.free(first)
    kv.stores_done(stores)
    again = request(tokens)
    prefix = kv.usable_prefix(again)
    assert prefix == ([], 0)  # GPU reuse is off
    slots = kv.cpu_hit(again, prefix)
    assert slots == [s for _, s in stores][:2]  # the third block holds the last token: computed
    kv.admit(again, prefix, slots)
    assert again.num_computed_tokens == 8 and kv.num_loaded_tokens == 8
    loads, _, _ = kv.take_offload()
    assert loads == list(zip(slots, again.block_ids[:2]))


def test_loads_wait_for_the_step_in_flight_only_into_blocks_freed_since_it_was_scheduled() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=2, num_cpu_blocks=4)
    kv.begin_step()
    old = kv.pool.allocate(2)  # blocks 0, 1: a running request's
    kv.begin_step()  # the step now in flight is scheduled, reading and writing them
    kv.pool.free(old)  # the request finished in the update; the step in flight may still write them
    kv.begin_step()  # the next step is being scheduled
    kv.offload.loads = [(0, b) for b in kv.pool.allocate(1)]  # block 2: free since before the step in flight
    assert kv.offload.loads == [(0, 2)] and kv.take_offload()[2] is False
    kv.offload.loads = [(1, b) for b in kv.pool.allocate(2)]  # blocks 3 and 0
    assert kv.take_offload()[2] is True
    kv.pool.free([0, 2, 3])
    kv.begin_step()
    kv.begin_step()  # two schedules later, the step that could write them is done
    kv.offload.loads = [(0, b) for b in kv.pool.allocate(3)]
    assert kv.take_offload()[2] is False


@pytest.mark.parametrize("seed", range(3))
def test_slot_runs_merge_only_consecutive_slots(seed: int) -> None:
    rng = random.Random(seed)
    slots = [rng.randrange(8) for _ in range(rng.randint(0, 12))] + [20, 21, 22, 40]
    runs = slot_runs(slots)
    assert [s + i for s, n in runs for i in range(n)] == slots
    assert runs[-2:] == [(20, 3), (40, 1)]


def test_a_later_copy_to_the_same_target_wins() -> None:
    assert last_per_target([(5, 1), (3, 2), (4, 1)], slot_at=0) == [(3, 2), (4, 1)]
    assert last_per_target([(9, 7), (8, 6), (2, 7)], slot_at=1) == [(8, 6), (2, 7)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("staging_blocks", [1, 2, 64])
def test_offloader_round_trip_on_cpu(dtype: torch.dtype, staging_blocks: int) -> None:
    kv_cache = torch.randn(9, 2, 2, 4, 1, 3).to(dtype)
    block_bytes = kv_cache[0].numel() * kv_cache.element_size()
    off = KVOffloader(kv_cache, num_slots=7, staging_bytes=staging_blocks * block_bytes)
    before = kv_cache.clone()
    stores = [(1, 3), (2, 4), (5, 0), (8, 6), (7, 0)]  # slot 0 twice: the later store, block 7, wins
    off.store(stores)
    assert (
        off.busy and off.completed() == stores and not off.busy
    )  # every store is reported, each block freed
    kv_cache.zero_()
    off.load([(3, 0), (4, 1), (0, 2), (6, 8), (6, 3)], wait_for_step=False)
    for block, src in [(0, 1), (1, 2), (2, 7), (8, 8), (3, 8)]:
        assert torch.equal(kv_cache[block], before[src]), block
    assert torch.count_nonzero(kv_cache[4:8]) == 0
    # Slots 0, 3-4, 6 and 6 again: four runs in one chunk; smaller chunks cut them further.
    assert off.num_load_copies == 4 if staging_blocks == 64 else off.num_load_copies >= 4


def test_sizes_and_config_errors() -> None:
    assert staging_blocks(10, 2**20) == 10  # no more than the tier's slots
    assert staging_blocks(1000, 2**20) == 64  # 64 MB of 1 MB blocks
    assert staging_blocks(1000, 2**27) == 1  # a block larger than the buffer: one at a time
    assert cpu_tier_num_blocks(CacheConfig(kv_offloading_size=1.0), 2**20) == 1024
    assert cpu_tier_num_blocks(CacheConfig(kv_offloading_size=1.0, num_cpu_blocks=7), 2**20) == 7
    assert CacheConfig(kv_offloading_size=0.5).offloads and not CacheConfig().offloads
    assert not CacheConfig(kv_offloading_size=1.0, num_cpu_blocks=0).offloads
    with pytest.raises(ValueError, match="prefix caching"):
        CacheConfig(enable_prefix_caching=False, kv_offloading_size=1.0)
    with pytest.raises(ValueError, match="kv_offloading_size"):
        CacheConfig(kv_offloading_size=-1.0)
    with pytest.raises(ValueError, match="prefix caching"):
        KVCacheManager(4, 4, enable_prefix_caching=False, num_cpu_blocks=2)
