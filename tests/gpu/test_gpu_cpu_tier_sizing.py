"""Start-up sizing with a CPU tier (6320a8a): the tier's two device staging buffers are counted before the KV cache
takes what `gpu_memory_utilization` leaves, so an engine whose every later round loads its prefixes from the tier
stays within its share of the GPU, and the offloader allocates on the device exactly the staging bytes that sizing
counted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roseinfer import LLM, SamplingParams
from roseinfer.runner.kv_offload import cpu_tier_num_blocks, staging_blocks
from tests.gpu.conftest import free_gpu
from tests.gpu.test_gpu_sampler_memory import two_layer_qwen

pytestmark = [pytest.mark.gpu, pytest.mark.alone]  # its engine takes 0.9 of the GPU

UTIL, PROMPTS, PROMPT_LEN, BLOCK = 0.9, 32, 1000, 16


def metric(llm: LLM, name: str) -> float:
    (value,) = [m.value for m in llm.get_metrics() if m.name == name]
    return value


def test_an_engine_loading_from_its_cpu_tier_stays_within_its_share_on_gpu(tmp_path):
    free_gpu()
    llm = LLM(
        two_layer_qwen(str(tmp_path)),
        load_format="dummy",
        # float32: the loaded round's last tokens run other kernels than the computed round's, and in bf16
        # one near-tie of the random weights flipped a greedy token (the 4th of one of 32 prompts, on an H200)
        dtype="float32",
        gpu_memory_utilization=UTIL,
        max_num_batched_tokens=2048,
        max_model_len=4096,
        block_size=BLOCK,
        kv_offloading_size=1.0,
        gpu_prefix_reuse=False,  # every later round's prefixes come back from the tier
    )
    runner = llm.engine.core.runner
    bb = runner.block_bytes()
    counted = 2 * staging_blocks(cpu_tier_num_blocks(llm.engine.config.cache, bb), bb) * bb
    off = runner.offloader
    assert off is not None and off.load_staging.numel() + off.store_staging.numel() == counted > 0
    total = torch.cuda.mem_get_info()[1]
    budget = int(total * UTIL)
    rng = np.random.default_rng(0)
    vocab = runner.cfg.vocab_size
    prompts = [rng.integers(10, vocab, PROMPT_LEN).tolist() for _ in range(PROMPTS)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    first = llm.generate(prompts, params, use_tqdm=False)
    again = llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    run_peak = torch.cuda.max_memory_allocated()
    # Every whole block before the one holding the last prompt token comes back from the tier.
    assert metric(llm, "roseinfer:cpu_prefix_cache_loaded_tokens") == PROMPTS * (PROMPT_LEN // BLOCK) * BLOCK
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in first]
    gib = 2**30
    assert run_peak <= budget, (
        f"the run peaked at {run_peak / gib:.2f} GiB, past {UTIL} of {total / gib:.2f} GiB"
    )
    del llm, runner, off, first, again
    free_gpu()
