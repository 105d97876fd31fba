"""Start-up sizing counts the sampler's worst case (`runner/sampler_profile.py`): an engine whose KV cache took
everything `gpu_memory_utilization` leaves, serving max_num_seqs requests at once with penalties, top-k / top-p /
min-p, allowed ids, biases, seeds, logprobs at max_logprobs and prompt logprobs, stays within that share of the
GPU. qwen2.5-0.5b's shape (a 152k vocabulary) with two layers: the sampler's [256, 152k] temporaries and the
penalty table dwarf the forward of a 2k-token budget, which is all that sizing measured before."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from roseinfer import LLM, SamplingParams
from roseinfer.models.layers import ForwardContext
from roseinfer.models.loader import BUILTIN_CONFIG_DIR
from roseinfer.runner.inputs import one_prefill_step, upload_step
from roseinfer.runner.model_runner import ModelRunner
from tests.gpu.conftest import free_gpu

pytestmark = [pytest.mark.gpu, pytest.mark.alone]  # its engine takes 0.9 of the GPU

MAX_SEQS, BUDGET, UTIL, MAX_LOGPROBS = 256, 2048, 0.9, 20


def two_layer_qwen(directory: str) -> str:
    with open(os.path.join(BUILTIN_CONFIG_DIR, "qwen2.5-0.5b.json")) as f:
        config = json.load(f)
    config["num_hidden_layers"] = 2
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return directory


@torch.inference_mode()
def forward_only_peak(runner: ModelRunner) -> int:
    """What sizing measured before it counted the sampler, beside the engine's KV cache: weights, one forward of
    a full token budget over a scratch cache, the lm_head over max_num_seqs rows (the KV cache's bytes left
    out)."""
    kv_bytes = runner.kv_cache.numel() * runner.kv_cache.element_size()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    n = min(BUDGET, runner.max_model_len)
    blocks = -(-n // runner.block_size)
    scratch = runner._new_kv_cache(blocks)
    step = one_prefill_step(n, runner.block_size)
    ids, pos, meta, _ = upload_step(step, runner.staging)
    hidden = runner.model(ids, pos, ForwardContext(scratch, meta, runner.backend))
    logits = runner.model.compute_logits(hidden[-MAX_SEQS:])
    del hidden, logits, scratch
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - kv_bytes


def test_a_busy_sampler_stays_within_the_profiled_budget_on_gpu(tmp_path):
    free_gpu()
    llm = LLM(
        two_layer_qwen(str(tmp_path)),
        load_format="dummy",
        dtype="bfloat16",
        gpu_memory_utilization=UTIL,
        max_num_seqs=MAX_SEQS,
        max_num_batched_tokens=BUDGET,
        max_model_len=4096,
        enforce_eager=True,  # the sampler's memory alone: no graph pools
        max_logprobs=MAX_LOGPROBS,
    )
    runner = llm.engine.core.runner
    vocab = runner.cfg.vocab_size
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, vocab, 8).tolist() for _ in range(MAX_SEQS)]  # one step prefills them all
    params = [
        SamplingParams(
            temperature=0.8,
            top_k=50,
            top_p=0.9,
            min_p=0.02,
            seed=i if i % 2 else None,
            max_tokens=6,
            ignore_eos=True,
            presence_penalty=0.5,
            frequency_penalty=0.5,
            repetition_penalty=1.2,
            logprobs=MAX_LOGPROBS,
            prompt_logprobs=MAX_LOGPROBS,
            allowed_token_ids=list(range(1000, 3000)),
            logit_bias={1000 + i: 2.0},
        )
        for i in range(MAX_SEQS)
    ]
    total = torch.cuda.mem_get_info()[1]
    budget = int(total * UTIL)
    old_peak = forward_only_peak(runner)  # before the run: nothing of the sampler's lives yet
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    outs = llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    run_peak = torch.cuda.max_memory_allocated()
    assert all(len(o.outputs[0].token_ids) == 6 and len(o.prompt_logprobs) == 8 for o in outs)
    table = runner.sampling.penalty_table
    assert table is not None and len(table.counts) == MAX_SEQS  # every request held a row at once
    gib = 2**30
    assert run_peak <= budget, (
        f"the run peaked at {run_peak / gib:.2f} GiB, past {UTIL} of {total / gib:.2f} GiB"
    )
    # The same run with the KV cache that the forward-only sizing gave: past the budget (the test has teeth).
    kv_bytes = runner.kv_cache.numel() * runner.kv_cache.element_size()
    old_kv = (budget - old_peak) // runner.block_bytes() * runner.block_bytes()
    old_run_peak = run_peak - kv_bytes + old_kv
    assert old_run_peak > budget, (old_run_peak / gib, budget / gib)
    del llm, runner, table, outs
    free_gpu()
