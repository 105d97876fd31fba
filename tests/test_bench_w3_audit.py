"""W3 of shared/WORKLOADS.md (shared prefix, online) checked against its text without a model: each prompt one
common 900-token prefix + 100 unique tokens, 30 output tokens, Poisson arrivals at 1, 2, 4, 8, 12, 16 req/s,
200 requests a rate; TTFT p50/p99, E2E p99 and the highest rate with p99 E2E <= 2 s. The online driver runs on a
fake engine and a virtual clock, so every latency it reports has a known value. Also `bench prefix`'s shared
pieces (`prefix_common`) and the per-step counters (`engine_probe.Probe`)."""

from __future__ import annotations

import argparse
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from roseinfer.bench import engine_probe, prefix, prefix_common, prefix_online
from roseinfer.bench.prefix_online import OnlineResult, build_w3, poisson_offsets, run_online
from roseinfer.bench.workloads import Workload, build_workload
from roseinfer.sampling_params import SamplingParams
from tests.virtual_clock import VirtualClock


def linear_percentile(values: list[float], q: float) -> float:
    """The q-th percentile, linear between the two nearest ranks (numpy's default, written out)."""
    x = sorted(values)
    rank = q / 100 * (len(x) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(x) - 1)
    return x[lo] + (rank - lo) * (x[hi] - x[lo])


def prefix_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    prefix.add_arguments(parser)
    return parser.parse_args(list(argv))


def spec_w3_prompts(
    vocab: int, seed: int, stream: int, n: int, plen: int = 900, slen: int = 100
) -> list[list[int]]:
    """prefix.py's docstring: the common prefix from default_rng(seed), stream k's suffixes from
    default_rng([seed, k]), ids in [1000, min(vocab, 32000))."""
    high = min(vocab, 32000)
    common = [int(t) for t in np.random.default_rng(seed).integers(1000, high, size=plen)]
    rng = np.random.default_rng([seed, stream])
    return [common + [int(t) for t in rng.integers(1000, high, size=slen)] for _ in range(n)]


def spec_offsets(n: int, rate: float, seed: int, stream: int) -> np.ndarray:
    """Arrivals of a Poisson process of `rate` from the first one (at 0): exponential gaps of mean 1/rate, drawn
    from default_rng([seed, stream, 1]) (the first draw is the gap before the first arrival, unused)."""
    gaps = np.random.default_rng([seed, stream, 1]).exponential(1 / rate, size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[1:])])


# -- the workload ----------------------------------------------------------------------------------


def test_the_standard_w3_constants():
    assert prefix_online.W3_RATES == (1.0, 2.0, 4.0, 8.0, 12.0, 16.0)
    assert prefix_online.W3_NUM_REQUESTS == 200
    assert prefix_online.w3_lengths(None, None) == (900, 100, 30)
    assert prefix_online.w3_lengths(1000, 30) == (900, 100, 30)  # a cap at the standard size leaves it
    args = prefix_args()
    assert args.slo_p99_s == 2.0 and args.rates is None and args.seed == 0


@pytest.mark.parametrize("vocab", (151936, 20011))
def test_w3_prompts_are_a_900_token_common_prefix_and_100_unique_tokens(vocab: int):
    seed = int(np.random.default_rng().integers(0, 2**31))
    for s, stream in ((0, 1), (seed, 3)):
        w = build_w3(vocab, 200, stream, seed=s)
        assert w.prompts == spec_w3_prompts(vocab, s, stream, 200)
        assert len({tuple(p[900:]) for p in w.prompts}) == 200
        for p in w.params:
            assert p.max_tokens == 30 and p.ignore_eos and p.temperature == 0.0
        assert not w.scaled and w.id == "W3" and w.seed == s
    assert build_w3(vocab, 199, 1).scaled and build_w3(vocab, 200, 1, output_len=29).scaled


def test_a_prompt_cap_shrinks_prefix_and_suffix_9_to_1():
    rng = np.random.default_rng()
    for cap in [*(int(x) for x in rng.integers(10, 999, size=5)), 999, 10]:
        p, s, o = prefix_online.w3_lengths(cap, int(rng.integers(1, 100)))
        assert p + s == cap and s == round(cap / 10) and o <= 30


def test_poisson_arrivals_at_the_rate():
    rng = np.random.default_rng()
    seed, stream = int(rng.integers(0, 1000)), int(rng.integers(1, 7))
    for rate in prefix_online.W3_RATES:
        got = poisson_offsets(200, rate, seed, stream)
        assert np.array_equal(got, spec_offsets(200, rate, seed, stream))
    # a Poisson process: gaps of mean 1/rate with a standard deviation of 1/rate
    gaps = np.diff(poisson_offsets(20000, 8.0, seed, stream))
    assert gaps.mean() == pytest.approx(1 / 8, rel=0.05) and gaps.std() == pytest.approx(1 / 8, rel=0.05)


# -- the driver, on a fake engine and a virtual clock -------------------------------------------------


class FakeEngine:
    """Every running request gets a token a step of `step_s`; it finishes after max_tokens of them."""

    def __init__(
        self, clock: VirtualClock, offsets: np.ndarray, step_s: float, rng: np.random.Generator
    ) -> None:
        self.clock, self.offsets, self.step_s, self.rng = clock, offsets, step_s, rng
        self.config = SimpleNamespace(device=torch.device("cpu"))
        self.running: dict[str, dict[str, Any]] = {}
        self.added: list[dict[str, Any]] = []
        self.finished: list[dict[str, Any]] = []

    def add_request(
        self, prompt: list[int], params: SamplingParams, request_id: str, arrival_time: float
    ) -> None:
        assert self.clock.now >= arrival_time  # not added before it arrives
        r = {"id": request_id, "arrival": arrival_time, "left": params.max_tokens, "first": None, "n": 0}
        r["cached"] = int(self.rng.integers(0, len(prompt)))
        self.running[request_id] = r
        self.added.append(r)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self, final_only: bool = False) -> list[Any]:
        assert final_only
        start = self.added[0]["arrival"]  # the first request arrives at offset 0
        due = int(np.sum(start + self.offsets <= self.clock.now + 1e-12))
        assert len(self.added) == due, "a request that had arrived was not added before the step"
        self.clock.now += self.step_s
        outs = []
        for rid, r in list(self.running.items()):
            r["n"] += 1
            r["left"] -= 1
            if r["first"] is None:
                r["first"] = self.clock.now
            if r["left"] == 0:
                del self.running[rid]
                r["done"] = self.clock.now
                self.finished.append(r)
                outs.append(
                    SimpleNamespace(
                        metrics=SimpleNamespace(arrival_time=r["arrival"], first_token_time=r["first"]),
                        num_cached_tokens=r["cached"],
                        outputs=[SimpleNamespace(token_ids=[7] * r["n"])],
                    )
                )
        return outs


@pytest.mark.parametrize("rate", (4.0, 40.0))
def test_the_online_driver_measures_from_each_scheduled_arrival(rate: float, monkeypatch):
    rng = np.random.default_rng()
    clock = VirtualClock(100.0)
    monkeypatch.setattr(prefix_online.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(prefix_online.time, "sleep", clock.sleep)
    n = 40
    w = build_w3(32000, n, 1, prefix_len=8, suffix_len=4, output_len=5)
    w = Workload("W3", "t", w.prompts, [SamplingParams(max_tokens=int(rng.integers(1, 6))) for _ in range(n)])
    offsets = poisson_offsets(n, rate, int(rng.integers(0, 1000)), 1)
    engine = FakeEngine(clock, offsets, 0.05, rng)
    t0 = clock.now
    res = run_online(engine, w, offsets, rate, progress=False)  # type: ignore[arg-type]
    start = engine.added[0]["arrival"]
    assert start >= t0
    # each request carries its scheduled arrival (queueing before the add counts)
    assert [r["arrival"] for r in engine.added] == pytest.approx(list(start + offsets), abs=1e-9)
    done = engine.finished
    assert res.ttft == pytest.approx([r["first"] - r["arrival"] for r in done], abs=1e-9)
    assert res.e2e == pytest.approx([r["done"] - r["arrival"] for r in done], abs=1e-9)
    assert res.cached_tokens == [r["cached"] for r in done]
    assert res.completion_tokens == w.num_output_tokens and res.rate == rate
    assert res.wall_s == pytest.approx(clock.now - start)
    assert len(res.ttft) == n


def test_a_rate_row_reports_linear_percentiles_and_the_slo_on_p99_e2e():
    rng = np.random.default_rng()
    n = int(rng.integers(5, 300))
    ttft = [float(x) for x in rng.uniform(0.01, 1.0, size=n)]
    e2e = [t + float(x) for t, x in zip(ttft, rng.uniform(0.0, 3.0, size=n))]
    cached = [int(x) for x in rng.integers(0, 900, size=n)]
    wall = float(rng.uniform(1, 100))
    res = OnlineResult(4.0, ttft, e2e, cached, wall, 30 * n)
    p99 = linear_percentile(e2e, 99)
    row = res.row(True, p99 + 1e-9)
    assert row["rate"] == 4.0 and row["cache"] == "on" and row["requests"] == n
    assert row["ttft_p50_ms"] == pytest.approx(linear_percentile(ttft, 50) * 1e3, rel=1e-12)
    assert row["ttft_p99_ms"] == pytest.approx(linear_percentile(ttft, 99) * 1e3, rel=1e-12)
    assert row["e2e_p50_s"] == pytest.approx(linear_percentile(e2e, 50), rel=1e-12)
    assert row["e2e_p99_s"] == pytest.approx(p99, rel=1e-12)
    assert row["achieved_req_s"] == pytest.approx(n / wall) and row["output_tok_s"] == pytest.approx(
        30 * n / wall
    )
    assert row["cached_tokens_mean"] == pytest.approx(np.mean(cached)) and row["cached_tokens_min"] == min(
        cached
    )
    assert row["slo_ok"] is True and res.row(False, p99 - 1e-9)["slo_ok"] is False
    assert res.row(False, p99)["cache"] == "off"
    # p99 E2E exactly at the SLO meets it; the SLO is on E2E, not on TTFT
    assert OnlineResult(1.0, [0.1] * 10, [2.0] * 10, [0] * 10, 1.0, 1).row(False, 2.0)["slo_ok"] is True
    assert OnlineResult(1.0, [0.1] * 10, [2.5] * 10, [0] * 10, 1.0, 1).row(False, 2.0)["slo_ok"] is False


def test_percentiles_are_linear_between_ranks():
    rng = np.random.default_rng()
    for _ in range(10):
        values = [float(x) for x in rng.normal(size=int(rng.integers(2, 50)))]
        for q in (50, 90, 99, float(rng.uniform(0, 100))):
            assert prefix_common.percentile(values, q) == pytest.approx(
                linear_percentile(values, q), abs=1e-12
            )


# -- bench_w3: streams, arrivals, both cache modes, the maximum rate -----------------------------------


def test_bench_w3_runs_every_rate_on_its_own_stream_cache_off_then_on(monkeypatch):
    seed = int(np.random.default_rng().integers(0, 1000))
    args = prefix_args("--seed", str(seed), "--no-progress")
    vocab = 151936
    engines: list[tuple[Workload, bool]] = []
    warmed: list[Workload] = []
    runs: list[tuple[Any, Workload, np.ndarray, float]] = []

    def make_engine(workload: Workload, cache: bool) -> Any:
        engines.append((workload, cache))
        return SimpleNamespace(cache=cache)

    def fake_run(
        engine: Any, workload: Workload, offsets: np.ndarray, rate: float, desc: str, progress: bool
    ):
        runs.append((engine, workload, offsets, rate))
        # E2E p99 grows with the rate, faster without the cache: off meets 2 s up to 4 req/s, on up to 12
        e2e = [rate / (6.0 if engine.cache else 2.0)] * workload.num_requests
        return OnlineResult(rate, [0.1] * workload.num_requests, e2e, [0] * workload.num_requests, 10.0, 1)

    monkeypatch.setattr(prefix_online, "run_online", fake_run)
    monkeypatch.setattr(prefix_online, "warm_up_online", lambda engine, w: warmed.append(w))
    bench = SimpleNamespace(
        args=args, model_config=SimpleNamespace(vocab_size=vocab), make_engine=make_engine, free=lambda: None,
        progress=False,
    )  # fmt: skip
    out = prefix_online.bench_w3(bench)  # type: ignore[arg-type]
    rates = [1.0, 2.0, 4.0, 8.0, 12.0, 16.0]
    assert [c for _, c in engines] == [False, True]
    assert [w.num_requests for w in warmed] == [32, 32]
    assert warmed[0].prompts == spec_w3_prompts(vocab, seed, 0, 32)  # the warm-up's own suffixes: stream 0
    assert len(runs) == 12
    for k, (engine, w, offsets, rate) in enumerate(runs):
        i = k % 6
        assert engine.cache == (k >= 6) and rate == rates[i]
        assert w.prompts == spec_w3_prompts(vocab, seed, i + 1, 200)
        assert set(w.output_lens) == {30}
        assert np.array_equal(offsets, spec_offsets(200, rate, seed, i + 1))
    assert out["max_rate_under_slo"] == {"off": 4.0, "on": 12.0}
    assert out["workload"]["rates"] == rates and out["workload"]["slo_p99_s"] == 2.0
    assert "cache off 4 req/s, cache on 12 req/s" in out["text"]


# -- prefix_common -----------------------------------------------------------------------------------


def test_make_engine_takes_the_defaults_only_where_the_user_gave_none(monkeypatch):
    seen: dict[str, Any] = {}

    def fake_config(model: str, **kw: Any) -> tuple[Any, str]:
        seen.update(kw)
        return SimpleNamespace(), "path"

    class FakeLLMEngine:
        def __init__(self, config: Any, path: str, model: Any) -> None:
            self.core = SimpleNamespace(runner=SimpleNamespace(model="weights"))

    monkeypatch.setattr(prefix_common, "make_engine_config", fake_config)
    monkeypatch.setattr(prefix_common, "LLMEngine", FakeLLMEngine)
    args = prefix_args("--block-size", "32", "--seed", "4")
    bench = prefix_common.PrefixBench(args, "tiny-llama", None, torch.device("cpu"), torch.float32)  # type: ignore[arg-type]
    w = build_workload("W2", 32000, num_requests=2)
    bench.make_engine(w, True, defaults={"block_size": 64, "max_num_seqs": 16})
    assert seen["block_size"] == 32 and seen["max_num_seqs"] == 16 and seen["enable_prefix_caching"] is True
    assert bench.shared_model == "weights"
    bench.make_engine(w, False)
    assert seen["enable_prefix_caching"] is False
    # the offline workloads take the seed and the caps
    bench.model_config = SimpleNamespace(vocab_size=32000)  # type: ignore[assignment]
    assert prefix_common.offline_workload(bench, "W2").prompts == build_workload("W2", 32000, seed=4).prompts
    for r, want in ((None, 3), (0, 1), (-2, 1), (5, 5)):
        bench.args.repeats = r
        assert bench.repeats(3) == want


# -- engine_probe.Probe --------------------------------------------------------------------------------


def test_the_probe_splits_steps_by_their_prompt_work(monkeypatch):
    rng = np.random.default_rng()
    now = [0.0]
    monkeypatch.setattr(engine_probe.time, "perf_counter", lambda: now[0])
    kv = SimpleNamespace(
        num_hit_tokens=int(rng.integers(0, 100)), num_queried_tokens=int(rng.integers(100, 200))
    )
    plan: list[list[int]] = []  # the prompt tokens of each schedule() call of the next step
    copied: list[list[tuple[int, int]]] = []
    core = SimpleNamespace(kv=kv, runner=SimpleNamespace(copy_blocks=copied.append))

    def schedule() -> Any:
        return SimpleNamespace(num_prompt_tokens=plan[0].pop(0))

    def step() -> tuple[list[Any], list[Any]]:
        while plan[0]:
            core.scheduler.schedule()  # an async step may schedule more than once
        plan.pop(0)
        now[0] += durations.pop(0)
        return [], []

    core.scheduler = SimpleNamespace(schedule=schedule)
    core.step = step
    probe = engine_probe.Probe(SimpleNamespace(core=core))  # type: ignore[arg-type]
    steps = [
        [int(rng.integers(1, 50)), int(rng.integers(0, 50))],
        [0],
        [int(rng.integers(1, 50))],
        [0, 0],
        [],
    ]
    durations = [float(x) for x in rng.uniform(0.001, 0.1, size=len(steps))]
    want_durations = list(durations)
    plan.extend([list(s) for s in steps])
    for _ in steps:
        core.step()
    prefill = [i for i, s in enumerate(steps) if sum(s)]
    assert probe.prompt_tokens_computed == sum(map(sum, steps))
    assert probe.prefill_steps == len(prefill) and probe.decode_steps == len(steps) - len(prefill)
    assert probe.prefill_time == pytest.approx(sum(want_durations[i] for i in prefill))
    assert probe.decode_time == pytest.approx(
        sum(d for i, d in enumerate(want_durations) if i not in prefill)
    )
    pairs = [(int(a), int(b)) for a, b in rng.integers(0, 100, size=(int(rng.integers(2, 9)), 2))]
    core.runner.copy_blocks(pairs)
    core.runner.copy_blocks(pairs[:1])
    assert probe.copies == len(pairs) + 1 and probe.copy_launches == 2 and copied == [pairs, pairs[:1]]
    kv.num_hit_tokens += 6
    kv.num_queried_tokens += 8
    assert (probe.hit_tokens, probe.queried_tokens, probe.hit_rate) == (6, 8, 0.75)
    probe.reset()
    assert (probe.hit_tokens, probe.queried_tokens, probe.hit_rate, probe.copies) == (0, 0, 0.0, 0)
