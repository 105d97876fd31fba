"""The engine switches the README names as bench flags reach the engine's config: `--no-async-scheduling`,
`--mixed-graph-max-tokens`, `--no-prefill-key-splits`, `--no-fold-norms`, `--no-pdl-decode` and
`--kv-cache-dtype` of `bench throughput` and `bench prefix`, and `--no-one-token-gemv` (with the fold, PDL and
KV-dtype flags) of `bench roofline`; left out, each keeps the engine's default."""

from __future__ import annotations

import random
from typing import Any

import pytest

from roseinfer.bench import roofline
from roseinfer.bench.engine_run import engine_kwargs
from roseinfer.bench.workloads import Limits, w1_fixed
from roseinfer.config import EngineConfig
from roseinfer.entrypoints.cli import build_parser
from roseinfer.entrypoints.llm import make_engine_config

SWITCHES = ("async_scheduling", "prefill_key_splits", "fold_norms", "pdl_decode")


def bench_config(argv: list[str]) -> EngineConfig:
    args = build_parser().parse_args(argv)
    workload = w1_fixed(256, Limits(num_requests=2, max_prompt_len=8, max_output_len=2))
    config, _ = make_engine_config("tiny-llama", **engine_kwargs(args, workload, "continuous"))
    return config


@pytest.mark.parametrize("bench", ["throughput", "prefix"])
@pytest.mark.parametrize("seed", range(3))
def test_bench_engine_flags_reach_the_config(bench: str, seed: int) -> None:
    rng = random.Random(seed)
    off = [s for s in SWITCHES if rng.random() < 0.5]
    cap = rng.choice([0, rng.randint(1, 4096)])
    kv = rng.choice(["fp8", "fp8_e5m2", "auto"])
    argv = ["bench", bench, "--model-shape", "tiny-llama", "--mixed-graph-max-tokens", str(cap)]
    argv += ["--kv-cache-dtype", kv] + [f"--no-{s.replace('_', '-')}" for s in off]
    config = bench_config(argv)
    assert {s: getattr(config, s) for s in SWITCHES} == {s: s not in off for s in SWITCHES}
    assert config.mixed_graph_max_tokens == cap and config.cache.kv_cache_dtype == kv


@pytest.mark.parametrize("bench", ["throughput", "prefix"])
def test_bench_engine_flags_left_out_keep_the_defaults(bench: str) -> None:
    config = bench_config(["bench", bench, "--model-shape", "tiny-llama"])
    default, _ = make_engine_config("tiny-llama", load_format="dummy")
    for name in (*SWITCHES, "mixed_graph_max_tokens"):
        assert getattr(config, name) == getattr(default, name)
    assert config.cache.kv_cache_dtype == default.cache.kv_cache_dtype == "auto"


class Built(Exception):
    pass


@pytest.mark.parametrize("seed", range(4))
def test_roofline_flags_reach_its_engine(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """`bench roofline` needs a GPU to time anything; up to building its engine it runs anywhere, so the LLM it
    builds is caught there, with its keywords."""
    rng = random.Random(seed)
    switches = ("one_token_gemv", "fold_norms", "pdl_decode")
    off = [s for s in switches if rng.random() < 0.5]
    kv = rng.choice(["fp8", "auto"])
    seen: dict[str, Any] = {}

    def fake_llm(model: str, **kwargs: Any) -> None:
        seen.update(kwargs, model=model)
        raise Built

    monkeypatch.setattr(roofline, "LLM", fake_llm)
    monkeypatch.setattr(roofline, "bench_header", lambda *a, **k: {})
    monkeypatch.setattr(roofline, "format_header", lambda header: "")
    monkeypatch.setattr(roofline, "measure_copy_bandwidth", lambda device: 1e12)
    monkeypatch.setattr(roofline, "measure_matmul_tflops", lambda device: 1e2)
    argv = ["bench", "roofline", "--model-shape", "qwen3-0.6b", "--kv-cache-dtype", kv]
    args = build_parser().parse_args(argv + [f"--no-{s.replace('_', '-')}" for s in off])
    with pytest.raises(Built):
        roofline.run_roofline(args)
    assert seen["model"] == "qwen3-0.6b" and seen["kv_cache_dtype"] == kv
    assert {s: seen[s] for s in switches} == {s: s not in off for s in switches}
    make_engine_config("tiny-llama", load_format="dummy", **{s: seen[s] for s in switches})  # real keywords
