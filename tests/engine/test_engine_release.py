"""An engine its owner dropped stops holding memory once the next engine of the process is built."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import pytest

from roseinfer import LLM
from roseinfer.runner.cuda_graphs import DecodeGraphs


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


def test_an_engine_with_graphs_is_freed_as_soon_as_it_is_dropped(llama_dir: str):
    """The graphs call the runner's forward but hold it weakly: no cycle, so no wait for the collector."""
    llm = LLM(llama_dir, device="cpu", dtype="float32", cpu_kv_tokens=256)
    runner = llm.engine.core.runner
    runner.graphs = DecodeGraphs(runner._forward_sample, runner.device, 4, runner.max_blocks_per_seq, 16)
    runner.mixed_graphs = runner.build_mixed_graphs(64)
    forward = runner.graphs.forward_sample
    alive = weakref.ref(runner)
    gc.collect()
    gc.disable()
    try:
        del llm, runner
        assert alive() is None
    finally:
        gc.enable()
    with pytest.raises(RuntimeError, match="runner these graphs belong to is gone"):
        forward()


FIRST_ENGINE = """
import gc, sys, weakref
from roseinfer import LLM
assert "torch._dynamo" not in sys.modules  # the build below imports it, as every process's first build does
gc.disable()
llm = LLM(sys.argv[1], device="cpu", dtype="float32", cpu_kv_tokens=256)
runner = weakref.ref(llm.engine.core.runner)
del llm
print("freed" if runner() is None else "alive")
"""


def test_the_first_engine_of_a_process_is_freed_as_soon_as_it_is_dropped(llama_dir: str):
    """torch's lazy import during a process's first model build leaves a garbage cycle that holds every frame
    on the stack, the engine constructors' included; the runner collects it after the build."""
    out = subprocess.run(
        [sys.executable, "-c", FIRST_ENGINE, llama_dir], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "freed"
