"""A built engine's heap is out of the cyclic collector's reach; the next engine's build thaws it."""

from __future__ import annotations

import gc
import weakref

import torch

from roseinfer import LLM


def _tracked(obj: object) -> bool:
    """Whether a collection would walk `obj` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


def test_the_engine_is_frozen_once_built_and_thawed_by_the_next_build(llama_dir: str) -> None:
    kwargs = dict(device="cpu", dtype="float32", cpu_kv_tokens=256)
    first = LLM(llama_dir, **kwargs)
    runner = first.engine.core.runner
    assert gc.get_freeze_count() > 0 and not _tracked(runner) and not _tracked(first.engine.groups)
    made_after = [[1]]
    assert _tracked(made_after)  # later objects are collected as usual
    runner.owner = first  # a cycle: only the collector can free it, and it must see it
    alive = weakref.ref(runner)
    del first, runner
    second = LLM(llama_dir, **kwargs)
    assert alive() is None
    assert not _tracked(second.engine.core.runner)


def test_a_build_leaves_no_garbage_of_its_own_to_freeze(llama_dir: str) -> None:
    """Only the young generations are collected before the freeze: an engine's garbage frozen in an older one
    would outlive it until the next build."""
    gc.collect()
    llm = LLM(llama_dir, device="cpu", dtype="float32", cpu_kv_tokens=256)
    gc.unfreeze()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        ours = [
            o for o in gc.garbage if isinstance(o, torch.Tensor) or type(o).__module__.startswith("roseinfer")
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.freeze()
    assert llm.engine.core.runner is not None and not ours
