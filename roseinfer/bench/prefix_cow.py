"""`bench prefix` W5 (copy-on-write of the shared partial block): TTFT, ITL and throughput cache off / on,
and how many copy-on-write copies ran in how many batched launches."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from roseinfer.bench.device import sync
from roseinfer.bench.engine_probe import Probe
from roseinfer.bench.engine_run import run_engine, warmup_workload
from roseinfer.bench.prefix_common import (
    CACHE_MODES,
    PrefixBench,
    cache_name,
    format_table,
    median_by,
    offline_workload,
    percentile,
)
from roseinfer.bench.workloads import Workload
from roseinfer.engine.llm_engine import LLMEngine


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
    sync(device)
    t0 = time.perf_counter()
    for i, (prompt, params) in enumerate(zip(workload.prompts, workload.params)):
        engine.add_request(prompt, params, request_id=f"w5-{i}")
    # Keyed by (request, sample): with n > 1 each streamed output holds the one sample that moved.
    seen: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], float] = {}
    started: set[str] = set()
    ttft: list[float] = []
    itl: list[float] = []
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.monotonic()
        for out in outs:
            for sample in out.outputs:
                key = (out.request_id, sample.index)
                count, prev = len(sample.token_ids), seen.get(key, 0)
                if count <= prev:
                    continue
                if prev:
                    itl.append((now - last[key]) / (count - prev))
                elif out.request_id not in started:  # a request's first token, whichever sample has it
                    started.add(out.request_id)
                    m = out.metrics
                    assert m is not None and m.first_token_time is not None
                    ttft.append(m.first_token_time - m.arrival_time)
                seen[key], last[key] = count, now
    completion = sum(seen.values())
    sync(device)
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
    workload = offline_workload(bench, "W5")
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
    run_engine(engine, warmup, f"W5 cache {cache_name(cache)} (warm-up)")
    runs = [run_offline_timed(engine, workload, probe) for _ in range(repeats)]
    r = median_by(runs, lambda x: x.total_time)
    return {
        "cache": cache_name(cache),
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
