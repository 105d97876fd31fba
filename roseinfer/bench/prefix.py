"""Prefix caching on vs off, in one process on the same dummy weights (WORKLOADS.md W2, W3, W4, W5).

    roseinfer bench prefix --model-shape qwen2.5-0.5b --workload all --json out/prefix.json

Every workload runs twice, on a fresh engine with the prefix cache off and on (the model is built once
and shared by every engine), after a warm-up on each engine:

- W4 (repeated prompt): naive / static / continuous x cache off / on: prefill s, decode s, tok/s, the
  prompt tokens actually computed and the hit rate (the notes: prefill 1.09 s -> 0.25 s).
- W3 (shared prefix, online): one common 900-token prefix + 100 unique tokens, 30 output tokens,
  Poisson arrivals at each rate, driven in-process on the engine's clock (time.monotonic): TTFT p50/p99,
  E2E p99 and the highest rate whose p99 E2E stays within the SLO (the notes: first token 500 ms ->
  < 100 ms, sustained rate 1 -> 10+ req/s at p99 <= 2 s).
- W5 (copy-on-write): 512 identical 65-token prompts, block size 64, max batch 16, 2 output tokens:
  ITL p50, TTFT p50, tok/s, and how many copy-on-write copies ran in how many batched launches.
- cow-micro: copying K blocks of the engine's KV cache as one batched `copy_blocks` vs one call per pair,
  us per copy (the notes: 24.8 us looped vs 6.5 us batched), and a check that both leave the same cache.
- W2 (mixed, no reuse): throughput with the cache on vs off; the bookkeeping should cost < 1 %.

Offline runs (W2, W4, W5) each start on a cold prefix cache (`BlockPool.reset_cache`); their warm-up
uses other token ids. W4's prefill/decode split and "prompt tok computed" come from a `Probe` on the
engine that reads each step's prompt work from its schedule (see `Probe` for why not `EngineCore.stats`).

W3's prompts: the common prefix comes from `numpy.random.default_rng(seed)`; the unique suffixes of
stream k (k = 0: the warm-up, k = i + 1: the i-th rate) from `default_rng([seed, k])`, and the arrival
gaps of rate i from `default_rng([seed, i + 1, 1])` (exponential, mean 1/rate). A rate's suffixes are
its own, so a rate never hits the suffix blocks of an earlier one; the common prefix stays hot after the
warm-up, as in a service that has been up for a while.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from roseinfer.bench.env import bench_header, format_header
from roseinfer.bench.throughput import RunResult, engine_kwargs, run_engine, warmup_workload
from roseinfer.bench.workloads import Workload, build_workload, token_id_range
from roseinfer.config import SCHEDULER_MODES, ModelConfig
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.llm import make_engine_config
from roseinfer.models.loader import DEFAULT_MODEL
from roseinfer.request import Request
from roseinfer.sampling_params import SamplingParams
from roseinfer.scheduler.scheduler import SchedulerOutput

WORKLOAD_IDS = ("W4", "W3", "W5", "cow-micro", "W2")  # the order of `--workload all`
W3_PREFIX_LEN = 900
W3_SUFFIX_LEN = 100
W3_OUTPUT_LEN = 30
W3_NUM_REQUESTS = 200
W3_RATES = (1.0, 2.0, 4.0, 8.0, 12.0, 16.0)
W3_WARMUP_REQUESTS = 32
COW_BLOCKS = 16
CACHE_MODES = (False, True)  # off first, then on


# -- small helpers ---------------------------------------------------------------------------------


def _cache_name(on: bool) -> str:
    return "on" if on else "off"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile; NaN for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def format_table(title: str, columns: Sequence[tuple[str, str, str]], rows: Sequence[dict[str, Any]]) -> str:
    """`columns`: (key, heading, format spec). Missing or None values print as "-"."""

    def cell(row: dict[str, Any], key: str, spec: str) -> str:
        value = row.get(key)
        if value is None or (isinstance(value, float) and np.isnan(value)):
            return "-"
        return format(value, spec)

    cells = [[cell(r, k, spec) for k, _, spec in columns] for r in rows]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, (_, h, _) in enumerate(columns)]
    line = "  ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths))
    out = [f"=== {title} ===", line, "-" * len(line)]
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(t) for t in text.replace(" ", ",").split(",") if t]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--rates must be comma-separated numbers: {e}") from e
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError(f"--rates must be positive, got {text!r}")
    return rates


def parse_workload(text: str) -> str:
    key = text.strip()
    if key.lower() in ("all", "cow-micro"):
        return key.lower()
    if key.upper() in WORKLOAD_IDS:
        return key.upper()
    raise argparse.ArgumentTypeError(f"unknown workload {text!r}; choose from {', '.join(WORKLOAD_IDS)}, all")


class Probe:
    """Instruments one engine through instance attributes (no engine code changes): counts the prompt
    tokens each step computes and splits step time into steps with / without prompt work, counts the
    copy-on-write copies and their batched launches, and takes the run's share of the KV manager's
    prefix-cache counters.

    `EngineCore.stats` classifies a step after it ran, when a request whose prompt was a full cache hit
    (one token left to compute) already holds its first output token: such steps count as decode there.
    Here the prompt work is read from the schedule, before the step runs.
    """

    def __init__(self, engine: LLMEngine) -> None:
        core = engine.core
        self.kv = core.kv
        self._schedule = core.scheduler.schedule
        self._step = core.step
        self._copy = core.runner.copy_blocks
        core.scheduler.schedule = self._on_schedule  # type: ignore[method-assign]
        core.step = self._on_step  # type: ignore[method-assign]
        core.runner.copy_blocks = self._on_copy  # type: ignore[method-assign]
        self._step_prompt_tokens = 0
        self.reset()

    def reset(self) -> None:
        self.prompt_tokens_computed = 0
        self.prefill_time = self.decode_time = 0.0
        self.prefill_steps = self.decode_steps = 0
        self.copies = self.copy_launches = 0
        self._hit0, self._queried0 = self.kv.num_hit_tokens, self.kv.num_queried_tokens

    @property
    def hit_tokens(self) -> int:
        return self.kv.num_hit_tokens - self._hit0

    @property
    def queried_tokens(self) -> int:
        return self.kv.num_queried_tokens - self._queried0

    @property
    def hit_rate(self) -> float:
        q = self.queried_tokens
        return self.hit_tokens / q if q else 0.0

    def _on_schedule(self) -> SchedulerOutput:
        out = self._schedule()
        n = 0
        for s in out.scheduled:
            r = s.request
            done = r.num_computed_tokens
            n += max(0, min(done + s.num_new_tokens, r.num_prompt_tokens) - done)
        self._step_prompt_tokens += n
        return out

    def _on_step(self) -> tuple[list[Request], list[Request]]:
        self._step_prompt_tokens = 0
        t0 = time.perf_counter()
        result = self._step()
        dt = time.perf_counter() - t0
        if self._step_prompt_tokens:
            self.prompt_tokens_computed += self._step_prompt_tokens
            self.prefill_time += dt
            self.prefill_steps += 1
        else:
            self.decode_time += dt
            self.decode_steps += 1
        return result

    def _on_copy(self, pairs: list[tuple[int, int]]) -> None:
        self.copy_launches += 1
        self.copies += len(pairs)
        self._copy(pairs)


# -- the shared context ----------------------------------------------------------------------------


@dataclass
class PrefixBench:
    """What every workload of the command shares: the options, the model, and its one set of weights."""

    args: argparse.Namespace
    model_name: str
    model_config: ModelConfig
    device: torch.device
    dtype: torch.dtype
    shared_model: nn.Module | None = None
    progress: bool = True

    def make_engine(
        self,
        workload: Workload,
        prefix_caching: bool,
        mode: str = "continuous",
        defaults: dict[str, Any] | None = None,
    ) -> LLMEngine:
        """A fresh engine on the shared weights; `defaults` apply where the user gave no option."""
        kw = engine_kwargs(self.args, workload, mode)
        for name, value in (defaults or {}).items():
            if getattr(self.args, name, None) is None:
                kw[name] = value
        kw["enable_prefix_caching"] = prefix_caching
        config, path = make_engine_config(self.model_name, **kw)
        engine = LLMEngine(config, path, self.shared_model)
        self.shared_model = engine.core.runner.model
        return engine

    def free(self) -> None:
        _free(self.device)

    def repeats(self, default: int) -> int:
        r = self.args.repeats
        return max(1, r if r is not None else default)


def _median_by(runs: list[Any], key: Callable[[Any], float]) -> Any:
    return sorted(runs, key=key)[(len(runs) - 1) // 2]


# -- W4: repeated prompt, every scheduler mode -----------------------------------------------------


def _run_offline(
    engine: LLMEngine, workload: Workload, name: str, repeats: int, probe: Probe | None
) -> tuple[RunResult, list[float]]:
    """`repeats` timed runs of `workload`, each on a cold prefix cache; the run of median total time.

    With a `probe` the prefill/decode split and the prompt tokens computed are the probe's (the engine's
    own figures stay in `extra` as engine_*); without one (W2: nothing may perturb the overhead being
    measured) they are the engine's.
    """
    kv = engine.core.kv
    runs = []
    for _ in range(repeats):
        kv.pool.reset_cache()  # every run starts cold: no hits on an earlier run's blocks
        hit0, queried0 = kv.num_hit_tokens, kv.num_queried_tokens
        if probe is not None:
            probe.reset()
        result = run_engine(engine, workload, name)
        ex = result.extra
        ex.update(
            num_hit_tokens=kv.num_hit_tokens - hit0, num_queried_tokens=kv.num_queried_tokens - queried0
        )
        if probe is not None:
            ex.update(
                engine_prefill_time=result.prefill_time,
                engine_decode_time=result.decode_time,
                engine_num_prompt_tokens_computed=ex["num_prompt_tokens_computed"],
                num_prompt_tokens_computed=probe.prompt_tokens_computed,
                num_prefill_steps=probe.prefill_steps,
                num_cow_copies=probe.copies,
                num_copy_launches=probe.copy_launches,
            )
            result.decode_time = probe.decode_time
            result.prefill_time = result.total_time - probe.decode_time
        runs.append(result)
    times = [r.total_time for r in runs]
    return _median_by(runs, lambda r: r.total_time), times


def _offline_row(result: RunResult, cache: bool, **extra: Any) -> dict[str, Any]:
    ex = result.extra
    hit, queried = ex["num_hit_tokens"], ex["num_queried_tokens"]
    row = {
        "cache": _cache_name(cache),
        "prefill_s": result.prefill_time,
        "decode_s": result.decode_time,
        "total_s": result.total_time,
        "output_tok_s": result.completion_throughput,
        "total_tok_s": result.total_throughput,
        "prompt_tokens": result.prompt_tokens,
        "prompt_tokens_computed": ex["num_prompt_tokens_computed"],
        "hit_rate": hit / queried if queried else 0.0,
        "num_steps": ex["num_steps"],
        "num_preemptions": ex["num_preemptions"],
    }
    for key in (
        "engine_prefill_time",
        "engine_decode_time",
        "engine_num_prompt_tokens_computed",
        "num_cow_copies",
        "num_copy_launches",
    ):
        if key in ex:
            row[key] = ex[key]
    row.update(extra)
    return row


def _offline_workload(bench: PrefixBench, workload_id: str) -> Workload:
    a = bench.args
    return build_workload(
        workload_id,
        bench.model_config.vocab_size,
        num_requests=a.num_requests,
        max_prompt_len=a.max_prompt_len,
        max_output_len=a.max_output_len,
        seed=a.seed,
    )


def bench_w4(bench: PrefixBench) -> dict[str, Any]:
    workload = _offline_workload(bench, "W4")
    warmup = warmup_workload(bench.args, workload, bench.model_config.vocab_size)
    repeats = bench.repeats(1)
    rows: list[dict[str, Any]] = []
    for mode in SCHEDULER_MODES[::-1]:  # naive, static, continuous
        for cache in CACHE_MODES:
            rows.append(_w4_one(bench, workload, warmup, mode, cache, repeats))
            bench.free()
    table = format_table(
        f"W4 repeated prompt: {workload.description}",
        [
            ("mode", "mode", "s"),
            ("cache", "cache", "s"),
            ("prefill_s", "prefill s", ".4f"),
            ("decode_s", "decode s", ".4f"),
            ("total_s", "total s", ".4f"),
            ("output_tok_s", "out tok/s", ".1f"),
            ("total_tok_s", "total tok/s", ".1f"),
            ("prompt_tokens_computed", "prompt tok computed", "d"),
            ("hit_rate", "hit rate", ".3f"),
        ],
        rows,
    )
    lines = [table]
    speedups: dict[str, float] = {}
    for mode in SCHEDULER_MODES[::-1]:
        off, on = (next(r for r in rows if r["mode"] == mode and r["cache"] == c) for c in ("off", "on"))
        speedups[mode] = off["prefill_s"] / on["prefill_s"] if on["prefill_s"] > 0 else float("nan")
        lines.append(
            f"W4 {mode}: prefill {off['prefill_s']:.4f} s -> {on['prefill_s']:.4f} s "
            f"({speedups[mode]:.2f}x), prompt tokens computed {off['prompt_tokens_computed']} -> "
            f"{on['prompt_tokens_computed']}"
        )
    return {
        "workload": workload.summary(),
        "rows": rows,
        "prefill_speedup": speedups,
        "text": "\n".join(lines),
    }


def _w4_one(
    bench: PrefixBench, workload: Workload, warmup: Workload, mode: str, cache: bool, repeats: int
) -> dict[str, Any]:
    engine = bench.make_engine(workload, cache, mode)
    probe = Probe(engine)
    run_engine(engine, warmup, f"W4 {mode} cache {_cache_name(cache)} (warm-up)")
    result, times = _run_offline(engine, workload, f"W4 {mode} cache {_cache_name(cache)}", repeats, probe)
    return _offline_row(result, cache, mode=mode, total_s_runs=times)


# -- W2: the cost of the cache when nothing is reused ----------------------------------------------


def bench_w2(bench: PrefixBench) -> dict[str, Any]:
    workload = _offline_workload(bench, "W2")
    warmup = warmup_workload(bench.args, workload, bench.model_config.vocab_size)
    repeats = bench.repeats(3)
    rows = []
    for cache in CACHE_MODES:
        engine = bench.make_engine(workload, cache)
        run_engine(engine, warmup, f"W2 cache {_cache_name(cache)} (warm-up)")
        result, times = _run_offline(engine, workload, f"W2 cache {_cache_name(cache)}", repeats, None)
        rows.append(_offline_row(result, cache, total_s_runs=times))
        del engine
        bench.free()
    off, on = rows
    rel = (on["output_tok_s"] - off["output_tok_s"]) / off["output_tok_s"]
    text = format_table(
        f"W2 mixed, cache overhead: {workload.description}; median of {repeats} run(s)",
        [
            ("cache", "cache", "s"),
            ("total_s", "total s", ".4f"),
            ("output_tok_s", "out tok/s", ".1f"),
            ("total_tok_s", "total tok/s", ".1f"),
            ("hit_rate", "hit rate", ".3f"),
            ("num_preemptions", "preemptions", "d"),
        ],
        rows,
    )
    text += f"\nW2 relative throughput, cache on vs off: {rel * 100:+.2f} % (target: within -1 %)"
    return {"workload": workload.summary(), "rows": rows, "relative_diff": rel, "text": text}


# -- W3: shared prefix, online ---------------------------------------------------------------------


def w3_lengths(max_prompt_len: int | None, max_output_len: int | None) -> tuple[int, int, int]:
    """(prefix, suffix, output) tokens; a prompt cap shrinks prefix and suffix in proportion (9:1)."""
    total = W3_PREFIX_LEN + W3_SUFFIX_LEN
    if max_prompt_len is None or max_prompt_len >= total:
        prefix, suffix = W3_PREFIX_LEN, W3_SUFFIX_LEN
    else:
        suffix = max(1, round(max_prompt_len * W3_SUFFIX_LEN / total))
        prefix = max(1, max_prompt_len - suffix)
    output = W3_OUTPUT_LEN if max_output_len is None else min(W3_OUTPUT_LEN, max_output_len)
    return prefix, suffix, output


def build_w3(
    vocab_size: int,
    num_requests: int,
    stream: int,
    *,
    prefix_len: int = W3_PREFIX_LEN,
    suffix_len: int = W3_SUFFIX_LEN,
    output_len: int = W3_OUTPUT_LEN,
    seed: int = 0,
) -> Workload:
    """W3's prompts of one stream: the common prefix (seed) + unique suffixes (seed, stream)."""
    low, high = token_id_range(vocab_size)
    prefix = np.random.default_rng(seed).integers(low, high, size=prefix_len).tolist()
    rng = np.random.default_rng([seed, stream])
    prompts = [prefix + rng.integers(low, high, size=suffix_len).tolist() for _ in range(num_requests)]
    params = [SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True) for _ in prompts]
    scaled = (prefix_len, suffix_len, output_len, num_requests) != (
        W3_PREFIX_LEN,
        W3_SUFFIX_LEN,
        W3_OUTPUT_LEN,
        W3_NUM_REQUESTS,
    )
    return Workload(
        "W3",
        f"{num_requests} requests = common {prefix_len}-token prefix + {suffix_len} unique tokens, "
        f"{output_len} output tokens, greedy",
        prompts,
        params,
        seed,
        scaled,
    )


def poisson_offsets(num_requests: int, rate: float, seed: int, stream: int) -> np.ndarray:
    """Arrival offsets in seconds from the first arrival (at 0), exponential gaps of mean 1/rate."""
    gaps = np.random.default_rng([seed, stream, 1]).exponential(1.0 / rate, size=num_requests)
    return np.concatenate([[0.0], np.cumsum(gaps[1:])])


@dataclass
class OnlineResult:
    rate: float
    ttft: list[float]
    e2e: list[float]
    cached_tokens: list[int]
    wall_s: float
    completion_tokens: int

    def row(self, cache: bool, slo_s: float) -> dict[str, Any]:
        e2e_p99 = percentile(self.e2e, 99)
        return {
            "rate": self.rate,
            "cache": _cache_name(cache),
            "requests": len(self.ttft),
            "ttft_p50_ms": percentile(self.ttft, 50) * 1e3,
            "ttft_p99_ms": percentile(self.ttft, 99) * 1e3,
            "e2e_p50_s": percentile(self.e2e, 50),
            "e2e_p99_s": e2e_p99,
            "achieved_req_s": len(self.ttft) / self.wall_s if self.wall_s > 0 else float("nan"),
            "output_tok_s": self.completion_tokens / self.wall_s if self.wall_s > 0 else float("nan"),
            "cached_tokens_mean": statistics.fmean(self.cached_tokens) if self.cached_tokens else 0.0,
            "cached_tokens_min": min(self.cached_tokens, default=0),
            "slo_ok": bool(e2e_p99 <= slo_s),
        }


def run_online(
    engine: LLMEngine,
    workload: Workload,
    offsets: np.ndarray,
    rate: float,
    desc: str = "",
    progress: bool = True,
) -> OnlineResult:
    """Replays `workload` with request i arriving `offsets[i]` s after the start, on the engine's clock.

    Each loop turn adds every request whose arrival has come (with its scheduled arrival as arrival_time,
    so queueing before the add counts), then steps the engine if it has work, else sleeps until the next
    arrival. TTFT = first token - arrival; E2E = the end of the step that finished it - arrival.
    """
    n = workload.num_requests
    device = engine.config.device
    ttft: list[float] = []
    e2e: list[float] = []
    cached: list[int] = []
    completion = 0
    _sync(device)
    start = time.monotonic() + 1e-3
    arrivals = (start + offsets).tolist()
    nxt = 0
    with tqdm(total=n, desc=desc, unit="req", disable=not progress, leave=False) as bar:
        while len(e2e) < n:
            now = time.monotonic()
            while nxt < n and arrivals[nxt] <= now:
                engine.add_request(
                    workload.prompts[nxt],
                    workload.params[nxt],
                    request_id=f"w3-{nxt}",
                    arrival_time=arrivals[nxt],
                )
                nxt += 1
            if engine.has_unfinished_requests():
                outs = engine.step(final_only=True)
                if outs:
                    _sync(device)
                    done = time.monotonic()
                    for out in outs:
                        m = out.metrics
                        assert m is not None and m.first_token_time is not None
                        ttft.append(m.first_token_time - m.arrival_time)
                        e2e.append(done - m.arrival_time)
                        cached.append(out.num_cached_tokens)
                        completion += sum(len(c.token_ids) for c in out.outputs)
                    bar.update(len(outs))
            elif nxt < n:
                time.sleep(max(0.0, arrivals[nxt] - time.monotonic()))
    wall = time.monotonic() - start
    return OnlineResult(rate, ttft, e2e, cached, wall, completion)


def _warm_up_offline(engine: LLMEngine, workload: Workload) -> None:
    for prompt, params in zip(workload.prompts, workload.params):
        engine.add_request(prompt, params)
    while engine.has_unfinished_requests():
        engine.step(final_only=True)
    _sync(engine.config.device)


def max_rate_under_slo(rows: list[dict[str, Any]]) -> float | None:
    ok = [r["rate"] for r in rows if r["slo_ok"]]
    return max(ok) if ok else None


def bench_w3(bench: PrefixBench) -> dict[str, Any]:
    a = bench.args
    vocab = bench.model_config.vocab_size
    n = a.num_requests if a.num_requests is not None else W3_NUM_REQUESTS
    prefix_len, suffix_len, output_len = w3_lengths(a.max_prompt_len, a.max_output_len)
    rates: list[float] = a.rates if a.rates is not None else list(W3_RATES)
    shape = {"prefix_len": prefix_len, "suffix_len": suffix_len, "output_len": output_len, "seed": a.seed}
    streams = [build_w3(vocab, n, i + 1, **shape) for i in range(len(rates))]
    n_warm = a.warmup_requests if a.warmup_requests is not None else W3_WARMUP_REQUESTS
    warm = build_w3(vocab, max(1, n_warm), 0, **shape)
    sizing = Workload("W3", streams[0].description, streams[0].prompts, streams[0].params, a.seed)
    slo = a.slo_p99_s
    rows: list[dict[str, Any]] = []
    for cache in CACHE_MODES:
        rows += _w3_one(bench, sizing, warm, streams, rates, cache, slo)
        bench.free()
    best = {c: max_rate_under_slo([r for r in rows if r["cache"] == c]) for c in ("off", "on")}
    text = format_table(
        f"W3 shared prefix, online: {streams[0].description}; Poisson arrivals; SLO p99 E2E <= {slo:g} s",
        [
            ("rate", "rate req/s", "g"),
            ("cache", "cache", "s"),
            ("ttft_p50_ms", "TTFT p50 ms", ".1f"),
            ("ttft_p99_ms", "TTFT p99 ms", ".1f"),
            ("e2e_p50_s", "E2E p50 s", ".3f"),
            ("e2e_p99_s", "E2E p99 s", ".3f"),
            ("achieved_req_s", "done req/s", ".2f"),
            ("cached_tokens_mean", "cached tok/req", ".1f"),
            ("slo_ok", "SLO ok", ""),
        ],
        sorted(rows, key=lambda r: (r["rate"], r["cache"])),
    )

    def fmt(rate: float | None) -> str:
        return "none of the rates" if rate is None else f"{rate:g} req/s"

    text += (
        f"\nW3 max rate with p99 E2E <= {slo:g} s: cache off {fmt(best['off'])}, cache on {fmt(best['on'])}"
    )
    return {
        "workload": streams[0].summary()
        | {"rates": rates, "slo_p99_s": slo, "warmup_requests": warm.num_requests},
        "rows": rows,
        "max_rate_under_slo": best,
        "text": text,
    }


def _w3_one(
    bench: PrefixBench,
    sizing: Workload,
    warm: Workload,
    streams: list[Workload],
    rates: list[float],
    cache: bool,
    slo: float,
) -> list[dict[str, Any]]:
    engine = bench.make_engine(sizing, cache)
    _warm_up_offline(engine, warm)
    rows = []
    for i, (rate, workload) in enumerate(zip(rates, streams)):
        offsets = poisson_offsets(workload.num_requests, rate, bench.args.seed, i + 1)
        desc = f"W3 cache {_cache_name(cache)} @ {rate:g} req/s"
        result = run_online(engine, workload, offsets, rate, desc, bench.progress)
        rows.append(result.row(cache, slo))
    return rows


# -- W5: copy-on-write of the shared partial block -------------------------------------------------


@dataclass
class StreamResult:
    ttft: list[float]
    itl: list[float]
    total_time: float
    prompt_tokens: int
    completion_tokens: int
    num_prompt_tokens_computed: int
    num_cow_copies: int
    num_copy_launches: int


def run_offline_timed(engine: LLMEngine, workload: Workload, probe: Probe) -> StreamResult:
    """Adds every request at once (on a cold prefix cache), steps to the end, timestamping each request's
    every token at the end of the step that produced it."""
    device = engine.config.device
    engine.core.kv.pool.reset_cache()
    probe.reset()
    _sync(device)
    t0 = time.perf_counter()
    for i, (prompt, params) in enumerate(zip(workload.prompts, workload.params)):
        engine.add_request(prompt, params, request_id=f"w5-{i}")
    seen: dict[str, int] = {}
    last: dict[str, float] = {}
    ttft: list[float] = []
    itl: list[float] = []
    completion = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.monotonic()
        for out in outs:
            count = len(out.outputs[0].token_ids)
            prev = seen.get(out.request_id, 0)
            if count > prev:
                if prev == 0:
                    m = out.metrics
                    assert m is not None and m.first_token_time is not None
                    ttft.append(m.first_token_time - m.arrival_time)
                else:
                    itl.append((now - last[out.request_id]) / (count - prev))
                seen[out.request_id], last[out.request_id] = count, now
            if out.finished:
                completion += sum(len(c.token_ids) for c in out.outputs)
    _sync(device)
    total = time.perf_counter() - t0
    return StreamResult(
        ttft,
        itl,
        total,
        workload.num_prompt_tokens,
        completion,
        probe.prompt_tokens_computed,
        probe.copies,
        probe.copy_launches,
    )


def bench_w5(bench: PrefixBench) -> dict[str, Any]:
    workload = _offline_workload(bench, "W5")
    warmup = warmup_workload(bench.args, workload, bench.model_config.vocab_size)
    repeats = bench.repeats(1)
    rows = []
    for cache in CACHE_MODES:
        rows.append(_w5_one(bench, workload, warmup, cache, repeats))
        bench.free()
    text = format_table(
        f"W5 copy-on-write: {workload.description}; engine {workload.engine_overrides}",
        [
            ("cache", "cache", "s"),
            ("ttft_p50_ms", "TTFT p50 ms", ".2f"),
            ("itl_p50_ms", "ITL p50 ms", ".3f"),
            ("itl_p99_ms", "ITL p99 ms", ".3f"),
            ("output_tok_s", "out tok/s", ".1f"),
            ("total_tok_s", "total tok/s", ".1f"),
            ("total_s", "total s", ".4f"),
            ("prompt_tokens_computed", "prompt tok computed", "d"),
            ("cow_copies", "COW copies", "d"),
            ("copy_launches", "copy launches", "d"),
        ],
        rows,
    )
    return {"workload": workload.summary(), "rows": rows, "text": text}


def _w5_one(
    bench: PrefixBench, workload: Workload, warmup: Workload, cache: bool, repeats: int
) -> dict[str, Any]:
    engine = bench.make_engine(workload, cache)
    probe = Probe(engine)
    run_engine(engine, warmup, f"W5 cache {_cache_name(cache)} (warm-up)")
    runs = [run_offline_timed(engine, workload, probe) for _ in range(repeats)]
    r = _median_by(runs, lambda x: x.total_time)
    return {
        "cache": _cache_name(cache),
        "ttft_p50_ms": percentile(r.ttft, 50) * 1e3,
        "ttft_p99_ms": percentile(r.ttft, 99) * 1e3,
        "itl_p50_ms": percentile(r.itl, 50) * 1e3,
        "itl_p99_ms": percentile(r.itl, 99) * 1e3,
        "output_tok_s": r.completion_tokens / r.total_time,
        "total_tok_s": (r.prompt_tokens + r.completion_tokens) / r.total_time,
        "total_s": r.total_time,
        "completion_tokens": r.completion_tokens,
        "prompt_tokens_computed": r.num_prompt_tokens_computed,
        "cow_copies": r.num_cow_copies,
        "copy_launches": r.num_copy_launches,
        "total_s_runs": [x.total_time for x in runs],
    }


# -- cow-micro: batched vs looped block copies -----------------------------------------------------


def time_per_call(fn: Callable[[], None], device: torch.device, iters: int, warmup: int = 3) -> float:
    """Seconds per call of `fn`: CUDA events around `iters` calls on a GPU, perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    _sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def cow_pairs(num_blocks: int, k: int) -> list[tuple[int, int]]:
    """k (src, dst) pairs over distinct blocks: sources 0..k-1, destinations k..2k-1."""
    if 2 * k > num_blocks:
        raise ValueError(f"{k} copies need {2 * k} distinct blocks; the cache has {num_blocks}")
    return [(i, k + i) for i in range(k)]


CopyFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]  # (kv_cache, src, dst)


def copy_variants(engine: LLMEngine) -> dict[str, CopyFn]:
    """The batched block copies to measure: the engine's backend, and on a GPU the Triton kernel too."""
    runner = engine.core.runner
    variants: dict[str, CopyFn] = {f"{runner.backend.name} backend.copy_blocks": runner.backend.copy_blocks}
    if runner.device.type == "cuda":
        try:
            from roseinfer.kernels.block_copy import copy_blocks as triton_copy_blocks
        except ImportError:
            pass
        else:
            variants["triton kernels.block_copy"] = triton_copy_blocks
    return variants


@torch.inference_mode()
def check_batched_equals_looped(copy_fn: CopyFn, like: torch.Tensor, pairs: list[tuple[int, int]]) -> bool:
    """Copies `pairs` with one batched `copy_fn` call into one random cache shaped like `like` (the blocks
    the pairs touch, plus one untouched), and one call per pair into a clone of it: True if both end up
    identical, each destination holds its source's old block, and every other block is unchanged."""
    num = min(like.shape[0], max(max(p) for p in pairs) + 2)
    gen = torch.Generator(device=like.device).manual_seed(0)
    shape = (num, *like.shape[1:])
    original = torch.randn(shape, generator=gen, device=like.device, dtype=torch.float32).to(like.dtype)
    batched, looped = original.clone(), original.clone()
    src = torch.tensor([p[0] for p in pairs], dtype=torch.int64, device=like.device)
    dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64, device=like.device)
    copy_fn(batched, src, dst)
    for i in range(len(pairs)):
        copy_fn(looped, src[i : i + 1], dst[i : i + 1])
    expected = original.clone()
    expected[dst] = original[src]
    _sync(like.device)
    return bool(torch.equal(batched, looped) and torch.equal(batched, expected))


@torch.inference_mode()
def measure_cow(engine: LLMEngine, k: int, iters: int) -> dict[str, Any]:
    """us per copied block, batched vs looped, for each copy variant with the index tensors already on the
    device, and for the engine's own path (`ModelRunner.copy_blocks(pairs)`, which builds and uploads
    the index tensors on every call)."""
    runner = engine.core.runner
    kv = runner.kv_cache
    assert kv is not None
    device = kv.device
    pairs = cow_pairs(kv.shape[0], k)
    src = torch.tensor([p[0] for p in pairs], dtype=torch.int64, device=device)
    dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64, device=device)
    singles = [(src[i : i + 1], dst[i : i + 1]) for i in range(k)]

    cases: list[tuple[str, Callable[[], None], Callable[[], None]]] = []
    for name, fn in copy_variants(engine).items():

        def batched(fn: CopyFn = fn) -> None:
            fn(kv, src, dst)

        def looped(fn: CopyFn = fn) -> None:
            for s, d in singles:
                fn(kv, s, d)

        cases.append((f"{name} (indices on device)", batched, looped))

    def runner_batched() -> None:
        runner.copy_blocks(pairs)

    def runner_looped() -> None:
        for p in pairs:
            runner.copy_blocks([p])

    cases.append(("runner.copy_blocks (indices uploaded)", runner_batched, runner_looped))
    rows = []
    for path, batched_fn, looped_fn in cases:
        b = time_per_call(batched_fn, device, iters) / k * 1e6
        lo = time_per_call(looped_fn, device, iters) / k * 1e6
        rows.append(
            {"path": path, "batched_us": b, "looped_us": lo, "speedup": lo / b if b > 0 else float("nan")}
        )
    block_bytes = kv[0].numel() * kv.element_size()
    return {"rows": rows, "block_bytes": block_bytes, "pairs": len(pairs), "iters": iters}


def bench_cow_micro(bench: PrefixBench) -> dict[str, Any]:
    a = bench.args
    k = a.cow_blocks
    # The W5 engine settings (block size 64), with a small pool: the copies need 2k distinct blocks.
    spec = build_workload("W5", bench.model_config.vocab_size, num_requests=1, max_output_len=1)
    engine = bench.make_engine(spec, True, defaults={"num_kv_blocks": max(2 * k + 1, 8)})
    try:
        pairs = cow_pairs(engine.core.num_blocks, k)
        kv = engine.core.runner.kv_cache
        assert kv is not None
        checks = {
            name: check_batched_equals_looped(fn, kv, pairs) for name, fn in copy_variants(engine).items()
        }
        del kv
        result = measure_cow(engine, k, a.cow_iters)
        block_size = engine.config.cache.block_size
        backend = engine.core.runner.backend.name
    finally:
        del engine
        bench.free()
    title = (
        f"cow-micro: {k} block copies ({result['block_bytes'] / 1024:.1f} KiB each, block size {block_size}, "
        f"{backend} backend), {a.cow_iters} iterations"
    )
    text = format_table(
        title,
        [
            ("path", "path", "s"),
            ("batched_us", "batched us/copy", ".2f"),
            ("looped_us", "looped us/copy", ".2f"),
            ("speedup", "looped/batched", ".2f"),
        ],
        result["rows"],
    )
    identical = all(checks.values())
    text += "\n" + "\n".join(
        f"cow-micro: {name}: batched copy leaves the cache identical to the looped copy: {ok}"
        for name, ok in checks.items()
    )
    return {
        "rows": result["rows"],
        "identical": identical,
        "identical_by_variant": checks,
        "num_copies": k,
        "block_bytes": result["block_bytes"],
        "block_size": block_size,
        "backend": backend,
        "iters": a.cow_iters,
        "text": text,
    }


# -- plots -----------------------------------------------------------------------------------------


def plot_w3(w3: dict[str, Any], path: str) -> str | None:
    """TTFT p99 and E2E p99 vs rate, cache on vs off; None (quietly) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax_ttft, ax_e2e) = plt.subplots(1, 2, figsize=(11, 4))
    for cache, style in (("off", "o--"), ("on", "s-")):
        rows = sorted((r for r in w3["rows"] if r["cache"] == cache), key=lambda r: r["rate"])
        rates = [r["rate"] for r in rows]
        ax_ttft.plot(rates, [r["ttft_p99_ms"] for r in rows], style, label=f"prefix cache {cache}")
        ax_e2e.plot(rates, [r["e2e_p99_s"] for r in rows], style, label=f"prefix cache {cache}")
    ax_e2e.axhline(w3["workload"]["slo_p99_s"], color="gray", linestyle=":", label="SLO")
    ax_ttft.set(xlabel="arrival rate (req/s)", ylabel="TTFT p99 (ms)", title="W3 TTFT p99", yscale="log")
    ax_e2e.set(xlabel="arrival rate (req/s)", ylabel="E2E p99 (s)", title="W3 E2E p99")
    for ax in (ax_ttft, ax_e2e):
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# -- the command -----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--model-shape", default=None, help=f"built-in shape id (default {DEFAULT_MODEL})")
    src.add_argument("--model", default=None, help="HF model directory or config.json (dummy weights)")
    parser.add_argument(
        "--workload", default="all", type=parse_workload, help="W2, W3, W4, W5, cow-micro or all (default)"
    )
    parser.add_argument("--num-requests", type=int, default=None, help="requests per workload (per W3 rate)")
    parser.add_argument("--max-prompt-len", type=int, default=None, help="shrink prompt lengths (W3: 9:1)")
    parser.add_argument("--max-output-len", type=int, default=None, help="shrink output lengths")
    parser.add_argument(
        "--rates", type=parse_rates, default=None, help="W3 arrival rates (default 1,2,4,8,12,16)"
    )
    parser.add_argument("--slo-p99-s", type=float, default=2.0, help="W3 SLO on p99 E2E latency, seconds")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument(
        "--warmup-requests",
        type=int,
        default=None,
        help=f"default: the workload's (W3: {W3_WARMUP_REQUESTS})",
    )
    parser.add_argument("--warmup-output-len", type=int, default=4, help="output tokens per warm-up request")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed runs of W2/W4/W5, median reported (default W2 3, else 1)",
    )
    parser.add_argument(
        "--cow-blocks", type=int, default=COW_BLOCKS, help="cow-micro: blocks copied per call"
    )
    parser.add_argument("--cow-iters", type=int, default=200, help="cow-micro: timed iterations")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="write every number here (plots beside it)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--max-num-seqs", type=int, default=None)
    engine.add_argument("--max-num-batched-tokens", type=int, default=None)
    engine.add_argument("--block-size", type=int, default=None)
    engine.add_argument("--gpu-memory-utilization", type=float, default=None)
    engine.add_argument("--num-kv-blocks", type=int, default=None)
    engine.add_argument("--max-model-len", type=int, default=None)
    engine.add_argument("--attention-backend", default=None)
    engine.add_argument("--enforce-eager", action="store_true")
    engine.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)


BENCHES: dict[str, Callable[[PrefixBench], dict[str, Any]]] = {
    "W4": bench_w4,
    "W3": bench_w3,
    "W5": bench_w5,
    "cow-micro": bench_cow_micro,
    "W2": bench_w2,
}


def run_prefix(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the command; prints the report and returns every number (also written to --json)."""
    if args.cow_blocks < 1 or args.cow_iters < 1:
        raise ValueError("--cow-blocks and --cow-iters must be >= 1")
    model = args.model or args.model_shape or DEFAULT_MODEL
    shape = os.path.basename(os.path.normpath(model)).removesuffix(".json")
    workloads = list(WORKLOAD_IDS) if args.workload == "all" else [args.workload]
    probe, _ = make_engine_config(model, load_format="dummy", dtype=args.dtype, device=args.device)
    bench = PrefixBench(
        args, model, probe.model_config, probe.device, probe.dtype, progress=not args.no_progress
    )
    header = bench_header(
        ",".join(workloads),
        shape,
        command=getattr(args, "argv", None),
        device=probe.device,
        dtype=str(probe.dtype).removeprefix("torch."),
        compare="prefix caching off vs on, fresh engine each, same weights",
        scaled=any(v is not None for v in (args.num_requests, args.max_prompt_len, args.max_output_len)),
    )
    print(format_header(header), flush=True)
    results: dict[str, Any] = {}
    for wid in workloads:
        res = BENCHES[wid](bench)
        print(res["text"], flush=True)
        results[wid] = res
    plots: dict[str, str] = {}
    if args.json:
        base = args.json.removesuffix(".json")
        if "W3" in results:
            made = plot_w3(results["W3"], f"{base}.W3.png")
            if made:
                plots["W3"] = made
                print(f"plot: {made}", flush=True)
    report = {
        "header": header,
        "results": {k: {kk: vv for kk, vv in v.items() if kk != "text"} for k, v in results.items()},
        "plots": plots,
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def run(args: argparse.Namespace) -> int:
    run_prefix(args)
    return 0
