"""`roseinfer bench serve`: WORKLOADS.md W8 (serve-random), online serving latency and throughput by arrival rate.

    roseinfer bench serve --model-shape qwen2.5-0.5b --json out/serve.json

Random prompts of 512 tokens ask for 128 tokens each (greedy, ignore_eos), arriving as a Poisson process, driven
in-process on the engine's clock as W3 is (`prefix_online.run_online`), but streamed: every engine step's outputs
(DELTA) are stamped when the step returns. Per rate it reports, each as mean / p50 / p95 / p99:
- TTFT: first token - arrival (queueing before admission counts: arrival is the scheduled one);
- TPOT: (last token - first token) / (output tokens - 1), one value a request;
- ITL: the gap between a request's consecutive outputs, split evenly over the tokens the later one brought (a
  step of async scheduling can bring two), one value a token after the first output;
- E2E: last token - arrival;
and the achieved request rate and output tokens/s over the run (the drain after the last arrival included), the
largest share of KV blocks held after a step and the preemptions: a rate that fills the cache shows there; the
longest engine step and the Triton kernels compiled during the run: a stall (a kernel variant the warm-up missed,
a collection) shows there.

Rates double from `--start-rate` until saturation: the first rate whose output tokens/s grew less than 10% over
the rate before it (the engine cannot take more), or `--max-rate`; then a last row sends the same number of
requests all at once (rate `inf`, vLLM's benchmark's default), the engine's offline ceiling on this workload, which
the best Poisson rate is held against. `--rates` gives a fixed list instead (`inf` allowed). Each rate
draws its own prompts (stream k = its index + 1; the warm-up is stream 0) and arrival gaps, from `--seed`.

`--peer vllm` then runs the same requests, arrivals and stamps through vLLM's `AsyncLLM` (`bench/serve_vllm.py`,
in a process of its own, once roseinfer's engine is gone) under the same limits, and prints the two side by side
(the plot draws both). HF transformers has no online server to set beside it: `bench throughput` holds the
comparisons with HF and with the hardware floor, offline.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from roseinfer.bench.device import sync
from roseinfer.bench.engine_run import add_engine_arguments, add_model_arguments, chosen_model, engine_kwargs
from roseinfer.bench.env import bench_header, format_header, write_json_report
from roseinfer.bench.jit_watch import watch_triton_compiles
from roseinfer.bench.plots import plot_w8, report_plot_path
from roseinfer.bench.prefix_common import format_table
from roseinfer.bench.prefix_online import add_arrived, poisson_offsets, warm_up_online
from roseinfer.bench.serve_common import (
    COLUMNS,
    LATENCIES,
    SATURATION_GROWTH,
    W8_MAX_RATE,
    W8_NUM_REQUESTS,
    W8_OUTPUT_LEN,
    W8_PROMPT_LEN,
    W8_START_RATE,
    W8_WARMUP_REQUESTS,
    ServeResult,
    build_w8,
)
from roseinfer.bench.serve_http import HTTP_COLUMNS, run_http
from roseinfer.bench.serve_vllm import COMPARE_COLUMNS, peer_command, side_by_side
from roseinfer.bench.vllm_peer import add_peer_option, peer_failed, run_peer
from roseinfer.bench.workloads import Workload
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.arg_types import arrival_rates, positive_float, positive_int
from roseinfer.entrypoints.llm import make_engine_config
from roseinfer.runner.gc_heap import release_dead_engines

__all__ = ["LATENCIES", "W8_NUM_REQUESTS", "ServeResult", "build_w8"]  # the W8 pieces, from serve_common


def run_serving(
    engine: LLMEngine,
    workload: Workload,
    offsets: np.ndarray,
    rate: float,
    desc: str = "",
    progress: bool = True,
) -> ServeResult:
    """Replays `workload` with request i arriving `offsets[i]` s after the start; the latencies of every request.

    Each loop turn adds every request whose arrival has come (its scheduled arrival as arrival_time), then steps
    the engine if it has work, else sleeps until the next arrival. An output's tokens are stamped when the step
    that returned them does."""
    n = workload.num_requests
    result = ServeResult(rate)
    kv, scheduler = engine.core.kv, engine.core.scheduler
    preempted = scheduler.num_preemptions
    sync(engine.config.device)
    start = time.monotonic() + 1e-3
    arrivals = (start + offsets).tolist()
    arrival = {f"w8-{i}": t for i, t in enumerate(arrivals)}
    nxt = 0
    bar = tqdm(total=n, desc=desc, unit="req", disable=not progress, leave=False)
    with bar, watch_triton_compiles() as compiled:
        while len(result.e2e) < n:
            now = time.monotonic()
            nxt = add_arrived(engine, workload, arrivals, nxt, now, "w8")
            if not engine.has_unfinished_requests():
                if nxt < n:
                    time.sleep(max(0.0, arrivals[nxt] - time.monotonic()))
                continue
            before = time.monotonic()
            outs = engine.step()
            result.kv_usage_max = max(result.kv_usage_max, kv.usage())
            now = time.monotonic()
            result.max_step_s = max(result.max_step_s, now - before)
            for out in outs:
                rid = out.request_id
                if result.on_output(rid, len(out.outputs[0].token_ids), out.finished, now, arrival[rid]):
                    bar.update(1)
    result.wall_s = time.monotonic() - start
    result.compiles = sum(compiled.values())
    result.preemptions = scheduler.num_preemptions - preempted
    return result


def _one_rate(
    engine: LLMEngine, workload: Workload, rate: float, args: argparse.Namespace, stream: int
) -> dict:
    offsets = poisson_offsets(workload.num_requests, rate, args.seed, stream)
    desc = f"W8 @ {rate:g} req/s"
    return run_serving(engine, workload, offsets, rate, desc, not args.no_progress).row()


def sweep_rates(args: argparse.Namespace) -> list[float]:
    """The fixed `--rates`, else start, 2 x start, ... up to `--max-rate` (the sweep may stop early)."""
    if args.rates is not None:
        return list(args.rates)
    rates, rate = [], args.start_rate
    while rate <= args.max_rate:
        rates.append(rate)
        rate *= 2
    return rates


def saturated(rows: list[dict[str, Any]]) -> bool:
    """Whether the last rate's output tok/s grew less than SATURATION_GROWTH over the rate before it."""
    return len(rows) >= 2 and not rows[-1]["output_tok_s"] >= SATURATION_GROWTH * rows[-2]["output_tok_s"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--num-requests", type=positive_int, default=W8_NUM_REQUESTS, help="requests a rate")
    parser.add_argument("--prompt-len", type=positive_int, default=W8_PROMPT_LEN)
    parser.add_argument("--output-len", type=positive_int, default=W8_OUTPUT_LEN)
    parser.add_argument(
        "--rates", type=arrival_rates, default=None, help="fixed arrival rates, req/s (no sweep)"
    )
    parser.add_argument(
        "--start-rate", type=positive_float, default=W8_START_RATE, help="the sweep's first rate"
    )
    parser.add_argument("--max-rate", type=positive_float, default=W8_MAX_RATE, help="the sweep's last rate")
    parser.add_argument("--warmup-requests", type=positive_int, default=W8_WARMUP_REQUESTS)
    parser.add_argument("--seed", type=int, default=0, help="prompts and arrivals seed")
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="write every number here (the plot beside it)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    parser.add_argument(
        "--http",
        action="store_true",
        help="then run the same rates through the OpenAI server (`roseinfer serve`'s) from a client process",
    )
    parser.add_argument(
        "--http-clients", type=positive_int, default=4, help="--http's client: worker processes sending requests"
    )
    parser.add_argument(
        "--http-engine",
        choices=["process", "thread"],
        default="process",
        help="--http's engine: in a process of its own (`roseinfer serve`'s default), or this one on a thread",
    )
    add_peer_option(parser, "the same rates and requests (its AsyncLLM)")
    add_engine_arguments(parser, prefix_caching_flag=True)


def run_serve(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the command; prints the report and returns every number (also written to --json)."""
    model, shape = chosen_model(args)
    probe, _ = make_engine_config(model, load_format="dummy", dtype=args.dtype, device=args.device)
    vocab = probe.model_config.vocab_size
    lengths = {"prompt_len": args.prompt_len, "output_len": args.output_len, "seed": args.seed}
    rates = sweep_rates(args)
    streams = [build_w8(vocab, args.num_requests, i + 1, **lengths) for i in range(len(rates))]
    warm = build_w8(vocab, args.warmup_requests, 0, **lengths)
    header = bench_header(
        "W8",
        shape,
        command=getattr(args, "argv", None),
        device=probe.device,
        dtype=str(probe.dtype).removeprefix("torch."),
        compare="offered against achieved rate, and against the same requests all at once (no HF server exists)",
        scaled=streams[0].scaled,
    )
    print(format_header(header), flush=True)
    kwargs = engine_kwargs(args, streams[0], "continuous")
    config, path = make_engine_config(model, **kwargs)
    engine: LLMEngine | None = LLMEngine(config, path)
    print(engine.core.startup.line(), flush=True)
    warm_up_online(engine, warm)
    rows: list[dict[str, Any]] = []
    for i, (rate, workload) in enumerate(zip(rates, streams)):
        rows.append(_one_rate(engine, workload, rate, args, i + 1))
        if args.rates is None and saturated(rows):
            break
    sat = rows[-1]["rate"] if args.rates is None and saturated(rows) else None
    text = ""
    if args.rates is None:  # the sweep ends with the same requests all at once: the engine's offline ceiling
        burst = build_w8(vocab, args.num_requests, len(rows) + 1, **lengths)
        rows.append(_one_rate(engine, burst, math.inf, args, len(rows) + 1))
        peak = max(r["output_tok_s"] for r in rows[:-1])
        text = (
            f"\nW8 saturation: output tok/s grew < {SATURATION_GROWTH - 1:.0%} from {rows[-3]['rate']:g} to {sat:g} req/s"
            if sat is not None
            else f"\nW8 not saturated up to {rows[-2]['rate']:g} req/s"
        )
        text += (
            f"\nW8 all at once (inf): {rows[-1]['output_tok_s']:.0f} out tok/s; the best Poisson rate reached "
            f"{peak / rows[-1]['output_tok_s']:.0%} of it"
        )
    text = format_table(f"W8 serve-random: {streams[0].description}; Poisson arrivals", COLUMNS, rows) + text
    print(text, flush=True)
    report = {
        "header": header,
        "workload": streams[0].summary()
        | {"rates": [r["rate"] for r in rows], "warmup_requests": warm.num_requests},
        "rows": rows,
        "saturated_at": sat,
        "startup": engine.core.startup.to_dict(),
        "plots": {},
    }
    if args.http:
        if args.http_engine == "process":
            engine = None  # the engine's process sizes its cache by the memory free when it starts
            release_dead_engines(config.device)
        report["http"] = http = run_http(engine, model, kwargs, args, vocab, [r["rate"] for r in rows])
        if "error" in http:
            print(http["error"], flush=True)
        else:
            title = f"W8 in-process against the same engine through its OpenAI server ({http['serving']})"
            print(format_table(title, HTTP_COLUMNS, side_by_side(rows, http["rows"], ("in-process", "HTTP"))))
    if args.peer == "vllm":
        engine = None  # vLLM sizes its cache by the memory free when it starts
        release_dead_engines(config.device)
        if config.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(config.device)
            print(
                f"roseinfer's engine released: {free / 2**30:.1f} of {total / 2**30:.1f} GiB free", flush=True
            )
        rates = [r["rate"] for r in rows]
        peer = report["peer"] = run_peer(lambda path: peer_command(args, model, vocab, rates, config, path))
        if "error" in peer:
            print(peer["error"], flush=True)
        else:
            title = f"W8 beside vLLM {peer['version']} (AsyncLLM in-process, the same requests and arrivals)"
            print(format_table(title, COMPARE_COLUMNS, side_by_side(rows, peer["rows"])), flush=True)
    if args.json:
        made = plot_w8(report, report_plot_path(args.json, "W8"))
        if made:
            report["plots"]["W8"] = made
            print(f"plot: {made}", flush=True)
        write_json_report(args.json, report)
    return report


def run(args: argparse.Namespace) -> int:
    report = run_serve(args)
    return 1 if peer_failed(report) or "error" in report.get("http", {}) else 0
