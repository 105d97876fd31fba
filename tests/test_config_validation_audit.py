"""Mutation audit (config.py): the engine configs' limits at their exact edges; each bad value a ValueError
naming its field."""

from __future__ import annotations

import pytest

from roseinfer.config import CacheConfig, SchedulerConfig


@pytest.mark.parametrize("block_size", [1, 2, 16, 256])
def test_block_sizes_that_are_powers_of_two(block_size):
    assert CacheConfig(block_size=block_size).block_size == block_size


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(block_size=3), "block_size must be a power of two"),
        (dict(block_size=24), "block_size must be a power of two"),
        (dict(block_size=0), "block_size must be a power of two"),
        (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
        (dict(gpu_memory_utilization=1.01), "gpu_memory_utilization"),
        (dict(num_blocks=0), "num_blocks must be >= 1"),
    ],
)
def test_bad_cache_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CacheConfig(**kwargs)


def test_the_cache_edges_that_are_allowed():
    assert CacheConfig(gpu_memory_utilization=1.0).gpu_memory_utilization == 1.0
    assert CacheConfig(num_blocks=1).num_blocks == 1


def test_scheduler_edges():
    assert SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=1).max_num_batched_tokens == 1
    for kwargs, message in [
        (dict(max_num_seqs=0), "max_num_seqs"),
        (dict(max_num_batched_tokens=0), "max_num_batched_tokens must be >= 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            SchedulerConfig(**kwargs)
