"""Start-up sizing beside another process on the GPU: while a second process holds half of what was free, an engine
whose `gpu_memory_utilization` asks for more than is left refuses by name (a ValueError); once that process is
gone, the same engine starts, its KV cache within the share."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from roseinfer import LLM, SamplingParams
from tests.gpu.conftest import free_gpu
from tests.models.tiny_models import save_hf_model

pytestmark = [pytest.mark.gpu, pytest.mark.alone]  # it reads the GPU's free memory

HOLDER = """
import sys, torch
held = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin
"""


def engine(directory: str, util: float) -> LLM:
    return LLM(directory, device="cuda", dtype="float32", gpu_memory_utilization=util, enforce_eager=True)


def test_a_share_other_processes_hold_is_refused_by_name_on_gpu(tmp_path):
    save_hf_model("llama", tmp_path)
    free_gpu()
    free, total = torch.cuda.mem_get_info()
    util = round(0.75 * free / total, 4)  # fits what is free now, not what the holder leaves
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(free // 2)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            ValueError, match=rf"gpu_memory_utilization={util} asks for .* free to this engine"
        ):
            engine(str(tmp_path), util)
    finally:
        holder.communicate("", timeout=60)
    free_gpu()
    llm = engine(str(tmp_path), util)
    kv_bytes = llm.engine.core.runner.kv_cache.numel() * llm.engine.core.runner.kv_cache.element_size()
    assert 0.5 * util * total < kv_bytes <= util * total
    out = llm.generate(
        [[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), use_tqdm=False
    )
    assert len(out[0].outputs[0].token_ids) == 2
