"""The CPU tier on the GPU: its copies on their own streams (runner/kv_offload.py), and greedy output with the
tier equal to the engine with every cache feature off, graphs and async scheduling on, over rounds that load
prefixes back from host memory."""

from __future__ import annotations

import pytest
import torch

from roseinfer import LLM, SamplingParams
from roseinfer.runner.kv_offload import KVOffloader
from tests.gpu.conftest import free_gpu
from tests.models.test_hf_parity import random_prompts

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _release_engines():
    yield
    free_gpu()


@pytest.mark.parametrize("num_blocks", [3, 17, 64])
def test_offloader_stores_and_loads_blocks_on_side_streams(num_blocks: int) -> None:
    kv = torch.randn(num_blocks, 3, 2, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    before = kv.clone()
    off = KVOffloader(kv, num_slots=num_blocks)
    blocks = torch.randperm(num_blocks).tolist()
    slots = torch.randperm(num_blocks).tolist()
    off.store(list(zip(blocks, slots)))
    done = off.completed(wait=True)
    assert sorted(done) == sorted(zip(blocks, slots)) and not off.busy
    kv.zero_()
    off.load([(s, b) for b, s in zip(blocks, slots)], wait_for_step=True)
    # The compute stream waits for the loads: this reads them complete, without a device-wide sync.
    assert torch.equal(kv.sum(dtype=torch.float32), before.sum(dtype=torch.float32)) and torch.equal(
        kv, before
    )


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.mark.parametrize(
    ("gpu_reuse", "enforce_eager", "kv_cache_dtype"),
    [
        (True, False, "auto"),
        (False, False, "auto"),
        (True, True, "auto"),
        (False, True, "auto"),
        (False, False, "fp8"),
    ],
)
def test_rounds_from_the_tier_match_the_cache_off_engine(
    model_dir, gpu_reuse: bool, enforce_eager: bool, kv_cache_dtype: str
) -> None:
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=9, lengths=[70, 33, 64, 65, 48, 100, 17, 90])
    prompts += [prompts[0][:50] + [5, 6, 7], prompts[5]]
    common = dict(
        device="cuda",
        dtype="float32",
        block_size=16,
        attention_backend="triton",
        max_num_seqs=4,
        kv_cache_dtype=kv_cache_dtype,  # fp8: the cache-off engine reads the same rounded K/V
    )
    off = LLM(directory, enable_prefix_caching=False, num_kv_blocks=256, **common)
    want = [o.outputs[0].token_ids for o in off.generate(prompts, greedy(), use_tqdm=False)]
    del off
    free_gpu()
    tier = LLM(
        directory,
        num_kv_blocks=24,  # 384 tokens: four requests' worth, so every round evicts what later rounds need
        num_cpu_blocks=128,
        gpu_prefix_reuse=gpu_reuse,
        enforce_eager=enforce_eager,
        max_num_batched_tokens=64,  # chunked prefills, so that loads land beside other requests' steps
        **common,
    )
    kv = tier.engine.core.kv
    for round_ in range(3):
        outs = tier.generate(prompts, greedy(), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == want, f"round {round_}"
        assert kv.num_free_blocks == kv.num_blocks and not kv.store_holds
    assert kv.num_loaded_tokens > 0
    offloader = tier.engine.core.runner.offloader
    assert offloader is not None and offloader.num_load_copies > 0 and offloader.num_store_copies > 0
