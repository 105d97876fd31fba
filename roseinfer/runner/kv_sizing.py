"""How many KV blocks fit in the share of the GPU's memory that the engine may take (`gpu_memory_utilization`)."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class GpuMemory:
    """Bytes on one GPU, read after start-up's worst-case step (`ModelRunner.profile_peak_memory`)."""

    total: int  # the device's memory
    free: int  # free on the device now: other processes' use and this one's CUDA context are out of it
    reserved: int  # what this engine's allocator holds now (weights, persistent buffers)
    peak: int  # the most this engine had allocated at once, the worst-case step included


def kv_cache_num_blocks(mem: GpuMemory, utilization: float, block_bytes: int) -> int:
    """Blocks of `block_bytes` that fit in `utilization` of the GPU beside the engine's peak use.

    As in vLLM, the engine's share must be free to take: where other processes hold so much that it is not, the
    error says so, rather than the KV cache's allocation (or a later step) running out of memory."""
    budget = int(mem.total * utilization)
    takeable = mem.free + mem.reserved
    if takeable < budget:
        raise ValueError(
            f"gpu_memory_utilization={utilization} asks for {budget / GIB:.2f} GiB of the GPU's "
            f"{mem.total / GIB:.2f} GiB, but only {takeable / GIB:.2f} GiB is free to this engine (other processes "
            "and its own CUDA context hold the rest): lower gpu_memory_utilization or free the GPU"
        )
    num_blocks = (budget - mem.peak) // block_bytes
    if num_blocks < 1:
        raise ValueError(
            f"no GPU memory left for the KV cache: the weights and the worst-case step peak at "
            f"{mem.peak / GIB:.2f} GiB of the {budget / GIB:.2f} GiB that gpu_memory_utilization={utilization} "
            "gives: raise gpu_memory_utilization, or lower max_num_batched_tokens or max_model_len"
        )
    return num_blocks
