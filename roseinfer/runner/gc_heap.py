"""The engine's dealings with Python's cyclic garbage collector.

A built engine's process holds a large, long-lived heap (torch, Triton, the model, the KV pool's bookkeeping):
431k tracked objects for qwen2.5-0.5b on an H100 host, whose full collection stalled a streamed W8 step for
about 300 ms once a run (160 ms for 342k objects on a 2-core CPU). Python runs one whenever enough objects have
outlived the young generations. As vLLM does after start-up, the heap alive once an engine is built is frozen
(`gc.freeze`): full collections walk only what was made since.
"""

from __future__ import annotations

import gc

import torch


def release_dead_engines(device: torch.device) -> None:
    """Free what earlier engines of this process left in reference cycles before this one sizes itself.

    An engine dropped by its owner can survive in a cycle until Python's cyclic collector happens to run,
    and its weights and KV cache would count as this engine's use. A frozen heap (an earlier engine's) is
    thawed first: the collector never looks at frozen objects.
    """
    gc.unfreeze()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def freeze_startup_heap() -> None:
    """Moves every object alive now out of the cyclic collector's reach, until the next engine's build.

    Only the young generations are collected first: a build leaves no older garbage (the loader collects the
    one cycle torch's first import makes), and a full collection here found none for 160 ms a build."""
    gc.collect(1)
    gc.freeze()
