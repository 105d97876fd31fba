"""End to end on the CPU: greedy output with the CPU tier equals the engine with every cache feature off,
while a GPU pool too small to keep the prompts makes later rounds load their prefixes from the tier."""

from __future__ import annotations

import numpy as np
import pytest

from roseinfer import LLM, SamplingParams
from roseinfer.entrypoints.cli import build_parser

BS = 4


def prompts(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    common = rng.integers(3, 384, size=17).tolist()  # a shared prefix ending one past a block boundary
    return [common + rng.integers(3, 384, size=int(n)).tolist() for n in rng.integers(1, 15, size=6)]


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def outputs(llm: LLM, batch: list[list[int]]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(batch, greedy(), use_tqdm=False)]


@pytest.mark.parametrize("gpu_reuse", [True, False])
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_rounds_load_from_the_tier_and_match_the_cache_off_engine(
    llama_dir: str, gpu_reuse: bool, async_scheduling: bool
) -> None:
    batch = prompts(0)
    off = LLM(llama_dir, device="cpu", block_size=BS, enable_prefix_caching=False)
    want = outputs(off, batch)
    tier = LLM(
        llama_dir,
        device="cpu",
        block_size=BS,
        num_kv_blocks=16,  # 64 tokens: not even two of the prompts stay cached
        num_cpu_blocks=64,
        gpu_prefix_reuse=gpu_reuse,
        max_num_seqs=2,
        async_scheduling=async_scheduling,
    )
    kv = tier.engine.core.kv
    # After the first round every prompt is cached whole, GPU or CPU: all its full blocks before the one
    # holding its last token (computed for its logits).
    whole = [(len(p) - 1) // BS * BS for p in batch]
    loaded = []
    for round_ in range(3):
        outs = tier.generate(batch, greedy(), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == want, f"round {round_}"
        if round_ > 0:
            assert [o.num_cached_tokens for o in outs] == whole
        assert kv.num_free_blocks == kv.num_blocks and not kv.store_holds
        assert not tier.engine.core.runner.offloader.busy
        loaded.append(kv.num_loaded_tokens)
    assert loaded[2] - loaded[1] >= (sum(whole) if not gpu_reuse else 1)
    assert kv.cpu is not None and kv.cpu.num_loads * BS == kv.num_loaded_tokens


def test_a_tier_smaller_than_the_work_still_matches(llama_dir: str) -> None:
    batch = prompts(1) + prompts(2)
    want = outputs(LLM(llama_dir, device="cpu", block_size=BS, enable_prefix_caching=False), batch)
    tier = LLM(llama_dir, device="cpu", block_size=BS, num_kv_blocks=12, num_cpu_blocks=5, max_num_seqs=3)
    for _ in range(2):
        assert outputs(tier, batch) == want
    kv = tier.engine.core.kv
    assert kv.cpu is not None and kv.cpu.num_evictions > 0


def test_cli_takes_the_tier_size() -> None:
    args = build_parser().parse_args(["generate", "--kv-offloading-size", "2.5"])
    assert args.kv_offloading_size == 2.5
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--kv-offloading-size", "-1"])


def test_the_tier_needs_prefix_caching(llama_dir: str) -> None:
    with pytest.raises(ValueError, match="prefix caching"):
        LLM(llama_dir, device="cpu", enable_prefix_caching=False, kv_offloading_size=1.0)


def test_metrics_report_the_tier(llama_dir: str) -> None:
    tier = LLM(llama_dir, device="cpu", block_size=BS, num_kv_blocks=12, num_cpu_blocks=5, max_num_seqs=3)
    batch = prompts(3)
    for _ in range(2):
        tier.generate(batch, greedy(), use_tqdm=False)
    kv = tier.engine.core.kv
    assert kv.cpu is not None
    got = {m.name: m.value for m in tier.get_metrics() if m.name.startswith("roseinfer:cpu_")}
    assert got == {
        "roseinfer:cpu_cache_usage_perc": kv.cpu.num_used / 5,
        "roseinfer:cpu_prefix_cache_loaded_tokens": kv.num_loaded_tokens,
        "roseinfer:cpu_cache_stored_blocks": kv.cpu.num_stores,
        "roseinfer:cpu_cache_evictions": kv.cpu.num_evictions,
    }
    assert got["roseinfer:cpu_cache_usage_perc"] == 1.0 and got["roseinfer:cpu_cache_evictions"] > 0
    plain = LLM(llama_dir, device="cpu", block_size=BS)
    assert not [m for m in plain.get_metrics() if m.name.startswith("roseinfer:cpu_")]
