"""`bench prefix` offline workloads: W4 (repeated prompt, every scheduler mode, cache off / on) and W2 (mixed,
no reuse: what the cache costs). Each timed run starts on a cold prefix cache."""

from __future__ import annotations

from typing import Any

from roseinfer.bench.engine_probe import Probe
from roseinfer.bench.engine_run import run_engine, warmup_workload
from roseinfer.bench.prefix_common import (
    CACHE_MODES,
    PrefixBench,
    cache_name,
    format_table,
    median_by,
    offline_workload,
)
from roseinfer.bench.run_result import RunResult
from roseinfer.bench.workloads import Workload
from roseinfer.config import SCHEDULER_MODES
from roseinfer.engine.llm_engine import LLMEngine


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
    return median_by(runs, lambda r: r.total_time), times


def _offline_row(result: RunResult, cache: bool, **extra: Any) -> dict[str, Any]:
    ex = result.extra
    hit, queried = ex["num_hit_tokens"], ex["num_queried_tokens"]
    row = {
        "cache": cache_name(cache),
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


def bench_w4(bench: PrefixBench) -> dict[str, Any]:
    workload = offline_workload(bench, "W4")
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
    run_engine(engine, warmup, f"W4 {mode} cache {cache_name(cache)} (warm-up)")
    result, times = _run_offline(engine, workload, f"W4 {mode} cache {cache_name(cache)}", repeats, probe)
    return _offline_row(result, cache, mode=mode, total_s_runs=times)


# -- W2: the cost of the cache when nothing is reused ----------------------------------------------


def bench_w2(bench: PrefixBench) -> dict[str, Any]:
    workload = offline_workload(bench, "W2")
    warmup = warmup_workload(bench.args, workload, bench.model_config.vocab_size)
    repeats = bench.repeats(3)
    rows = []
    for cache in CACHE_MODES:
        engine = bench.make_engine(workload, cache)
        run_engine(engine, warmup, f"W2 cache {cache_name(cache)} (warm-up)")
        result, times = _run_offline(engine, workload, f"W2 cache {cache_name(cache)}", repeats, None)
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
