"""An engine its owner dropped stops holding memory once the next engine of the process is built."""

from __future__ import annotations

import gc
import weakref

from roseinfer import LLM


def test_a_dropped_engine_caught_in_a_cycle_is_freed_by_the_next_engine(llama_dir: str):
    kwargs = dict(device="cpu", dtype="float32", cpu_kv_tokens=256)
    gc.collect()
    gc.disable()
    try:
        first = LLM(llama_dir, **kwargs)
        first.engine.core.runner.owner = first  # a cycle, as CUDA graphs make: only gc frees it
        runner = weakref.ref(first.engine.core.runner)
        del first
        assert runner() is not None
        second = LLM(llama_dir, **kwargs)
        assert runner() is None
        assert second.engine.core.num_blocks == 256 // second.engine.core.runner.block_size
    finally:
        gc.enable()
