"""Start-up sizing (`runner/kv_sizing.py`): the KV cache takes what `gpu_memory_utilization` leaves beside the
engine's peak, and where other processes hold the GPU so that the share cannot be taken, the engine says so by
name (a ValueError, so the CLI prints one line) instead of running out of memory."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from roseinfer.config import CacheConfig
from roseinfer.runner.kv_sizing import GIB, GpuMemory, kv_cache_num_blocks
from roseinfer.runner.model_runner import ModelRunner

BLOCK = 2 * 2**20  # bytes a block


def memory(
    free_gib: float, reserved_gib: float = 1.0, peak_gib: float = 3.0, total_gib: float = 80.0
) -> GpuMemory:
    return GpuMemory(
        total=int(total_gib * GIB),
        free=int(free_gib * GIB),
        reserved=int(reserved_gib * GIB),
        peak=int(peak_gib * GIB),
    )


@pytest.mark.parametrize("util", [0.3, 0.5, 0.9])
def test_blocks_fill_the_share_beside_the_peak(util):
    mem = memory(free_gib=78.5)
    assert kv_cache_num_blocks(mem, util, BLOCK) == (int(mem.total * util) - mem.peak) // BLOCK


def test_the_share_may_take_exactly_what_is_free_and_the_engine_holds():
    mem = memory(free_gib=71.0, reserved_gib=1.0)
    budget = int(mem.total * 0.9)  # 72 GiB
    exact = GpuMemory(total=mem.total, free=budget - mem.reserved, reserved=mem.reserved, peak=mem.peak)
    assert kv_cache_num_blocks(exact, 0.9, BLOCK) == (budget - mem.peak) // BLOCK
    short = GpuMemory(total=mem.total, free=budget - mem.reserved - 1, reserved=mem.reserved, peak=mem.peak)
    with pytest.raises(ValueError) as e:
        kv_cache_num_blocks(short, 0.9, BLOCK)
    assert str(e.value).startswith(
        "gpu_memory_utilization=0.9 asks for 72.00 GiB of the GPU's 80.00 GiB, but only"
    )
    assert "lower gpu_memory_utilization or free the GPU" in str(e.value)


def test_other_processes_holding_the_gpu_are_named_not_an_out_of_memory():
    # Another process holds 40 GiB: 0.9 of 80 GiB can no longer be taken, though the KV cache alone (69 GiB
    # beside a 3 GiB peak) is what would have failed to allocate.
    with pytest.raises(ValueError, match=r"only 39\.50 GiB is free to this engine \(other processes"):
        kv_cache_num_blocks(memory(free_gib=38.5), 0.9, BLOCK)
    assert (
        kv_cache_num_blocks(memory(free_gib=38.5), 0.45, BLOCK) == (int(80 * GIB * 0.45) - 3 * GIB) // BLOCK
    )


def test_a_peak_that_leaves_no_block_is_named():
    mem = memory(free_gib=78.5, peak_gib=36.0)
    budget = int(mem.total * 0.45)
    one = GpuMemory(total=mem.total, free=mem.free, reserved=mem.reserved, peak=budget - BLOCK)
    assert kv_cache_num_blocks(one, 0.45, BLOCK) == 1
    none = GpuMemory(total=mem.total, free=mem.free, reserved=mem.reserved, peak=budget - BLOCK + 1)
    with pytest.raises(
        ValueError, match=r"no GPU memory left for the KV cache: .* peak at 36\.00 GiB of the 36\.00 GiB"
    ):
        kv_cache_num_blocks(none, 0.45, BLOCK)
    with pytest.raises(ValueError, match="raise gpu_memory_utilization, or lower max_num_batched_tokens"):
        kv_cache_num_blocks(memory(free_gib=78.5, peak_gib=40.0), 0.45, BLOCK)


@pytest.mark.parametrize("seed", range(4))
def test_start_up_sizing_reads_the_gpu_as_kv_sizing_expects(monkeypatch, seed):
    """`ModelRunner.determine_num_blocks` on CUDA, its readings faked: mem_get_info's (free, total) in that
    order, the allocator's reserved bytes, the profiled peak and the configured share all reach the sizing. The
    free memory drawn is short of the share by less than the engine reserves: only free + reserved can take it."""
    rng = random.Random(seed)
    total = rng.randint(16, 96) * GIB
    util = round(rng.uniform(0.3, 0.85), 3)
    reserved = rng.randint(GIB // 2, 4 * GIB)
    peak = reserved + rng.randint(GIB // 2, 4 * GIB)
    budget = int(total * util)
    free = budget - reserved + rng.randint(0, reserved - 1)
    reads: list[object] = []

    def mem_get_info(device: torch.device) -> tuple[int, int]:
        reads.append(device)
        return free, total

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: reserved)
    cache = SimpleNamespace(num_blocks=None, cpu_kv_tokens=0, gpu_memory_utilization=util, offloads=False)
    runner = SimpleNamespace(
        config=SimpleNamespace(cache=cache),
        device=torch.device("cuda", 0),
        block_size=16,
        profile_peak_memory=lambda: peak,
        block_bytes=lambda: BLOCK,
    )
    assert ModelRunner.determine_num_blocks(runner) == (budget - peak) // BLOCK
    assert reads == [runner.device]
    free = budget - reserved - 1  # one byte short of the share
    with pytest.raises(ValueError, match=rf"gpu_memory_utilization={util} asks for"):
        ModelRunner.determine_num_blocks(runner)


@pytest.mark.parametrize(("tier_gib", "staged"), [(1.0, 32), (0.01, 5)])
def test_start_up_sizing_leaves_room_for_the_cpu_tiers_staging(
    monkeypatch, tier_gib: float, staged: int
) -> None:
    """With a CPU tier, its two staging buffers (64 MB of blocks each, no more than the tier's slots) come out of the
    KV cache's share, as the profiled peak does."""
    total, util, reserved, peak = 80 * GIB, 0.5, GIB, 3 * GIB
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (total - reserved, total))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: reserved)
    runner = SimpleNamespace(
        config=SimpleNamespace(cache=CacheConfig(gpu_memory_utilization=util, kv_offloading_size=tier_gib)),
        device=torch.device("cuda", 0),
        block_size=16,
        profile_peak_memory=lambda: peak,
        block_bytes=lambda: BLOCK,
    )
    want = (int(total * util) - peak - 2 * staged * BLOCK) // BLOCK
    assert ModelRunner.determine_num_blocks(runner) == want
