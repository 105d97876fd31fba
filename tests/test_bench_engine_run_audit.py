"""How `bench throughput` / `bench prefix` drive the engine (`roseinfer.bench.engine_run`): every engine flag
reaches make_engine_config under its own keyword and wins over the workload's settings, the CPU pool holds the
whole workload, the warm-up meets the timed run's shapes without sharing a prompt with it, and a timed run's
figures (prefill = elapsed - decode, the decode-only steps and their median, step paths of this run only)
come out of a faked engine and clock exactly."""

from __future__ import annotations

import argparse
import inspect
import statistics
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from roseinfer.bench import engine_run, throughput
from roseinfer.bench.workloads import Workload, build_workload
from roseinfer.entrypoints.llm import make_engine_config
from roseinfer.sampling_params import SamplingParams


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    throughput.add_arguments(p)
    return p


def random_engine_flags(rng: np.random.Generator) -> tuple[list[str], dict[str, Any]]:
    """Every engine flag with a random value: (argv, the make_engine_config keywords it must give)."""
    argv: list[str] = []
    want: dict[str, Any] = {}
    for flag in ("--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--num-kv-blocks",
                 "--max-model-len", "--mixed-graph-max-tokens"):  # fmt: skip
        value = int(rng.integers(1, 10_000))
        argv += [flag, str(value)]
        want[flag[2:].replace("-", "_")] = value
    utilization = round(float(rng.uniform(0.1, 0.95)), 3)
    argv += ["--gpu-memory-utilization", str(utilization)]
    want["gpu_memory_utilization"] = utilization
    backend = str(rng.choice(["torch", "triton"]))
    argv += ["--attention-backend", backend]
    want["attention_backend"] = backend
    kv = str(rng.choice(["auto", "fp8", "fp8_e5m2"]))
    argv += ["--kv-cache-dtype", kv]
    want["kv_cache_dtype"] = kv
    policy = str(rng.choice(["fcfs", "lpm", "lof"]))
    argv += ["--admission-policy", policy]
    want["admission_policy"] = policy
    for name in ("enable-prefix-caching", "enable-chunked-prefill", "async-scheduling", "fold-norms",
                 "pdl-decode", "prefill-key-splits"):  # fmt: skip
        on = bool(rng.integers(2))
        argv.append(f"--{name}" if on else f"--no-{name}")
        want[name.replace("-", "_")] = on
    argv.append("--enforce-eager")
    want["enforce_eager"] = True
    return argv, want


def test_every_engine_flag_reaches_the_engine_and_wins_over_the_workload():
    rng = np.random.default_rng()
    known = set(inspect.signature(make_engine_config).parameters)
    for workload_id in ("W1", "W5"):  # W5 sets block_size and max_num_seqs of its own
        workload = build_workload(workload_id, 32000, num_requests=3, max_prompt_len=40, max_output_len=3)
        argv, want = random_engine_flags(rng)
        kw = engine_run.engine_kwargs(parser().parse_args(argv), workload, "static")
        assert set(kw) <= known
        assert {k: kw[k] for k in want} == want
        assert kw["scheduler_mode"] == "static" and kw["load_format"] == "dummy"
        # no flag: the workload's settings, else make_engine_config's defaults (the keyword is left out)
        kw = engine_run.engine_kwargs(parser().parse_args([]), workload, "naive")
        assert {k: kw[k] for k in want if k in kw} == workload.engine_overrides
        assert "enforce_eager" not in kw


def test_the_cpu_pool_holds_every_request_in_whole_blocks():
    rng = np.random.default_rng()
    for _ in range(10):
        n = int(rng.integers(1, 200))
        prompts = [[1] * int(rng.integers(1, 300)) for _ in range(n)]
        params = [SamplingParams(max_tokens=int(rng.integers(1, 300)), ignore_eos=True) for _ in range(n)]
        workload = Workload("test", "random", prompts, params)
        block = int(rng.choice([1, 16, 64]))
        argv = ["--block-size", str(block)] if rng.integers(2) else []
        block = block if argv else 16  # make_engine_config's default block size
        assert inspect.signature(make_engine_config).parameters["block_size"].default == 16
        kw = engine_run.engine_kwargs(parser().parse_args(argv), workload, "continuous")
        need = 0
        for p, s in zip(prompts, params):
            tokens = len(p) + s.max_tokens
            blocks = tokens // block + (1 if tokens % block else 0)
            need += blocks * block
        assert kw["cpu_kv_tokens"] == max(engine_run.CPU_KV_TOKENS, need)


def test_the_warmup_meets_the_timed_shapes_with_other_prompts():
    rng = np.random.default_rng()
    for workload_id in ("W1", "W2", "W4"):
        num, prompt_len, out_len = int(rng.integers(2, 9)), int(rng.integers(20, 80)), int(rng.integers(1, 9))
        warm_len = int(rng.integers(1, 9)) if workload_id != "W4" else out_len + int(rng.integers(1, 4))
        argv = ["--num-requests", str(num), "--max-prompt-len", str(prompt_len), "--max-output-len", str(out_len),
                "--warmup-output-len", str(warm_len)]  # fmt: skip
        asked = int(rng.integers(num + 1, 2 * num)) if workload_id == "W1" else int(rng.integers(1, 2 * num))
        argv += ["--warmup-requests", str(asked)] if asked != num else []
        args = parser().parse_args(argv)
        timed = build_workload(workload_id, 32000, num_requests=num, max_prompt_len=prompt_len,
                               max_output_len=out_len, seed=args.seed)  # fmt: skip
        warm = engine_run.warmup_workload(args, timed, 32000)
        n = min(asked, num)
        assert warm.num_requests == n
        if workload_id == "W2":  # random lengths, scaled to the same caps
            assert max(warm.prompt_lens) <= prompt_len and max(warm.output_lens) <= min(out_len, warm_len)
        else:  # fixed lengths: the timed run's prompts, outputs cut to --warmup-output-len
            assert warm.prompt_lens == timed.prompt_lens[:n]
            assert warm.output_lens == [min(o, warm_len) for o in timed.output_lens[:n]]
        # nothing the timed run could find in the prefix cache: no first block in common
        assert not {tuple(p[:16]) for p in warm.prompts} & {tuple(p[:16]) for p in timed.prompts}


class FakeClock:
    def __init__(self, rng: np.random.Generator) -> None:
        self.now = float(rng.uniform(0, 1000))

    def perf_counter(self) -> float:
        return self.now


class FakeEngine:
    """Steps a scripted list of (seconds, is pure decode, tokens out) on a fake clock, booking decode-only steps'
    time as the engine core does."""

    def __init__(self, rng: np.random.Generator, clock: FakeClock, workload: Workload) -> None:
        self.clock, self.rng = clock, rng
        self.script: list[tuple[float, bool, int]] = []
        left = workload.num_output_tokens
        while left:
            tokens = int(rng.integers(0, min(left, 5) + 1))
            self.script.append((float(rng.uniform(1e-3, 1e-1)), bool(rng.integers(2)), tokens))
            left -= tokens
        self.script.append((float(rng.uniform(1e-3, 1e-1)), True, 0))
        stats = SimpleNamespace(decode_time=float(rng.uniform(1, 9)), prefill_time=float(rng.uniform(1, 9)),
                                device_wait_time=0.25, num_steps=5, num_prompt_tokens_computed=7)  # fmt: skip

        def reset() -> None:
            stats.decode_time = stats.prefill_time = 0.0

        stats.reset = reset
        self.paths_before = {k: int(rng.integers(0, 50)) for k in ("decode_graph", "mixed_graph", "eager")}
        runner = SimpleNamespace(step_paths=dict(self.paths_before), mixed_graph_max_tokens=512)
        self.core = SimpleNamespace(stats=stats, runner=runner, scheduler=SimpleNamespace(num_preemptions=3),
                                    num_blocks=99)  # fmt: skip
        self.config = SimpleNamespace(
            device=SimpleNamespace(type="cpu"),
            scheduler=SimpleNamespace(policy="fcfs", max_num_batched_tokens=64, max_num_seqs=8),
            cache=SimpleNamespace(kv_cache_dtype="auto"),
        )
        self.add_seconds = float(rng.uniform(1e-3, 1e-2))
        self.steps = 0

    def add_request(self, prompt: list[int], params: SamplingParams) -> None:
        self.clock.now += self.add_seconds

    def has_unfinished_requests(self) -> bool:
        return self.steps < len(self.script)

    def step(self, final_only: bool = False) -> list[Any]:
        seconds, decode, tokens = self.script[self.steps]
        self.steps += 1
        self.clock.now += seconds
        stats = self.core.stats
        if decode:
            stats.decode_time += seconds
        else:
            stats.prefill_time += seconds
        path = str(self.rng.choice(list(self.paths_before)))
        self.core.runner.step_paths[path] += 1
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0] * tokens)])]


def test_a_timed_run_books_its_time_and_steps_exactly(monkeypatch):
    rng = np.random.default_rng()
    clock = FakeClock(rng)
    monkeypatch.setattr(engine_run, "time", clock)
    workload = build_workload("W2", 32000, num_requests=int(rng.integers(1, 6)), max_output_len=12)
    engine = FakeEngine(rng, clock, workload)
    r = engine_run.run_engine(engine, workload, "continuous")  # type: ignore[arg-type]
    adds = workload.num_requests * engine.add_seconds
    total = adds + sum(s for s, _, _ in engine.script)
    decode_steps = [s for s, d, _ in engine.script if d]
    assert r.total_time == pytest.approx(total, rel=1e-9)
    assert r.decode_time == pytest.approx(sum(decode_steps), rel=1e-9)
    assert r.prefill_time == pytest.approx(total - sum(decode_steps), rel=1e-9)  # adds and prefill steps
    assert (r.prompt_tokens, r.completion_tokens) == (workload.num_prompt_tokens, workload.num_output_tokens)
    x = r.extra
    assert x["add_time"] == pytest.approx(adds, rel=1e-9)
    assert x["num_decode_steps"] == len(decode_steps)
    assert x["decode_step_median_s"] == pytest.approx(statistics.median(decode_steps), rel=1e-9)
    moved = {k: engine.core.runner.step_paths[k] - engine.paths_before[k] for k in engine.paths_before}
    assert x["step_paths"] == moved and sum(moved.values()) == len(engine.script)
    assert x["scheduler"] == {"policy": "fcfs", "max_num_batched_tokens": 64, "max_num_seqs": 8,
                              "mixed_graph_max_tokens": 512, "kv_cache_dtype": "auto"}  # fmt: skip
    assert (x["num_preemptions"], x["num_kv_blocks"], x["device_wait_time"]) == (3, 99, 0.25)


def test_a_run_that_falls_short_of_the_workloads_tokens_is_refused(monkeypatch):
    rng = np.random.default_rng()
    clock = FakeClock(rng)
    monkeypatch.setattr(engine_run, "time", clock)
    workload = build_workload("W1", 32000, num_requests=2, max_output_len=4)
    engine = FakeEngine(rng, clock, workload)
    i = next(i for i, (_, _, t) in enumerate(engine.script) if t)
    s, d, t = engine.script[i]
    engine.script[i] = (s, d, t - 1)  # one token lost
    with pytest.raises(RuntimeError, match=f"{workload.num_output_tokens - 1} completion tokens"):
        engine_run.run_engine(engine, workload, "naive")  # type: ignore[arg-type]
