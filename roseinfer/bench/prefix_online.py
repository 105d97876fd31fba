"""`bench prefix` W3 (shared prefix, online): the workload's prompts, Poisson arrivals, and an in-process
driver on the engine's clock measuring TTFT and E2E per rate, cache off / on, against a p99 E2E SLO."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from roseinfer.bench.device import sync
from roseinfer.bench.prefix_common import CACHE_MODES, PrefixBench, cache_name, format_table, percentile
from roseinfer.bench.workloads import Workload, token_id_range
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.sampling_params import SamplingParams

W3_PREFIX_LEN = 900
W3_SUFFIX_LEN = 100
W3_OUTPUT_LEN = 30
W3_NUM_REQUESTS = 200
W3_RATES = (1.0, 2.0, 4.0, 8.0, 12.0, 16.0)
W3_WARMUP_REQUESTS = 32


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


def add_arrived(
    engine: LLMEngine, workload: Workload, arrivals: list[float], nxt: int, now: float, prefix: str
) -> int:
    """Adds the requests from `nxt` on whose arrival time has come by `now`, as `{prefix}-{i}` with the scheduled
    arrival as arrival_time (so queueing before the add counts); returns the first one not added yet."""
    while nxt < len(arrivals) and arrivals[nxt] <= now:
        engine.add_request(
            workload.prompts[nxt],
            workload.params[nxt],
            request_id=f"{prefix}-{nxt}",
            arrival_time=arrivals[nxt],
        )
        nxt += 1
    return nxt


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
            "cache": cache_name(cache),
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
    sync(device)
    start = time.monotonic() + 1e-3
    arrivals = (start + offsets).tolist()
    nxt = 0
    with tqdm(total=n, desc=desc, unit="req", disable=not progress, leave=False) as bar:
        while len(e2e) < n:
            now = time.monotonic()
            nxt = add_arrived(engine, workload, arrivals, nxt, now, "w3")
            if engine.has_unfinished_requests():
                outs = engine.step(final_only=True)
                if outs:
                    sync(device)
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


def warm_up_online(engine: LLMEngine, workload: Workload, num_alone: int = 4) -> None:
    """Most warm-up prompts at once, the last few one at a time: an online run's steps (one prompt
    alone, a prompt beside decodes) have launch shapes an offline batch never makes, and each new shape
    that Triton specialises on would otherwise compile inside the measurement. Every prompt is distinct,
    so none of the lone ones is a whole-prompt hit."""
    n = workload.num_requests
    alone = min(num_alone, n - 1)
    for batch in [range(n - alone)] + [[i] for i in range(n - alone, n)]:
        for i in batch:
            engine.add_request(workload.prompts[i], workload.params[i])
        while engine.has_unfinished_requests():
            engine.step(final_only=True)
    sync(engine.config.device)


def max_rate_under_slo(rows: list[dict[str, Any]]) -> float | None:
    """The highest rate up to which every rate met the SLO (None if the lowest did not)."""
    best = None
    for r in sorted(rows, key=lambda r: r["rate"]):
        if not r["slo_ok"]:
            break
        best = r["rate"]
    return best


def bench_w3(bench: PrefixBench) -> dict[str, Any]:
    a = bench.args
    vocab = bench.model_config.vocab_size
    n = a.num_requests if a.num_requests is not None else W3_NUM_REQUESTS
    prefix_len, suffix_len, output_len = w3_lengths(a.max_prompt_len, a.max_output_len)
    rates: list[float] = a.rates if a.rates is not None else list(W3_RATES)
    shape = {"prefix_len": prefix_len, "suffix_len": suffix_len, "output_len": output_len, "seed": a.seed}
    streams = [build_w3(vocab, n, i + 1, **shape) for i in range(len(rates))]
    n_warm = a.warmup_requests if a.warmup_requests is not None else W3_WARMUP_REQUESTS
    warm = build_w3(vocab, n_warm, 0, **shape)
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
    warm_up_online(engine, warm)
    rows = []
    for i, (rate, workload) in enumerate(zip(rates, streams)):
        offsets = poisson_offsets(workload.num_requests, rate, bench.args.seed, i + 1)
        desc = f"W3 cache {cache_name(cache)} @ {rate:g} req/s"
        result = run_online(engine, workload, offsets, rate, desc, bench.progress)
        rows.append(result.row(cache, slo))
    return rows
