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
engine that reads each step's prompt work from its schedule.

W3's prompts: the common prefix comes from `numpy.random.default_rng(seed)`; the unique suffixes of
stream k (k = 0: the warm-up, k = i + 1: the i-th rate) from `default_rng([seed, k])`, and the arrival
gaps of rate i from `default_rng([seed, i + 1, 1])` (exponential, mean 1/rate). A rate's suffixes are
its own, so a rate never hits the suffix blocks of an earlier one; the common prefix stays hot after the
warm-up, as in a service that has been up for a while.

This module is the command (options, dispatch, the report); the workloads live in `prefix_offline` (W4,
W2), `prefix_online` (W3), `prefix_cow` (W5) and `prefix_cow_micro`, on `prefix_common.PrefixBench` and
`engine_probe.Probe`; `plots` draws the W3 plot.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from roseinfer.bench.engine_run import add_engine_arguments, add_model_arguments, chosen_model
from roseinfer.bench.env import bench_header, format_header, write_json_report
from roseinfer.bench.plots import plot_w3, report_plot_path
from roseinfer.bench.prefix_common import PrefixBench
from roseinfer.bench.prefix_cow import bench_w5
from roseinfer.bench.prefix_cow_micro import COW_BLOCKS, bench_cow_micro
from roseinfer.bench.prefix_offline import bench_w2, bench_w4
from roseinfer.bench.prefix_online import W3_WARMUP_REQUESTS, bench_w3
from roseinfer.entrypoints.arg_types import arrival_rates, positive_int
from roseinfer.entrypoints.llm import make_engine_config

WORKLOAD_IDS = ("W4", "W3", "W5", "cow-micro", "W2")  # the order of `--workload all`


def parse_workload(text: str) -> str:
    key = text.strip()
    if key.lower() in ("all", "cow-micro"):
        return key.lower()
    if key.upper() in WORKLOAD_IDS:
        return key.upper()
    raise argparse.ArgumentTypeError(f"unknown workload {text!r}; choose from {', '.join(WORKLOAD_IDS)}, all")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument(
        "--workload", default="all", type=parse_workload, help="W2, W3, W4, W5, cow-micro or all (default)"
    )
    parser.add_argument("--num-requests", type=int, default=None, help="requests per workload (per W3 rate)")
    parser.add_argument("--max-prompt-len", type=int, default=None, help="shrink prompt lengths (W3: 9:1)")
    parser.add_argument("--max-output-len", type=int, default=None, help="shrink output lengths")
    parser.add_argument(
        "--rates", type=arrival_rates, default=None, help="W3 arrival rates (default 1,2,4,8,12,16)"
    )
    parser.add_argument("--slo-p99-s", type=float, default=2.0, help="W3 SLO on p99 E2E latency, seconds")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument(
        "--warmup-requests",
        type=positive_int,
        default=None,
        help=f"default: the workload's (W3: {W3_WARMUP_REQUESTS})",
    )
    parser.add_argument(
        "--warmup-output-len", type=positive_int, default=4, help="output tokens per warm-up request"
    )
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
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="write every number here (plots beside it)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    add_engine_arguments(parser, prefix_caching_flag=False)  # the bench itself turns the cache on and off


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
    model, shape = chosen_model(args)
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
        if "W3" in results:
            made = plot_w3(results["W3"], report_plot_path(args.json, "W3"))
            if made:
                plots["W3"] = made
                print(f"plot: {made}", flush=True)
    report = {
        "header": header,
        "results": {k: {kk: vv for kk, vv in v.items() if kk != "text"} for k, v in results.items()},
        "plots": plots,
    }
    if args.json:
        write_json_report(args.json, report)
    return report


def run(args: argparse.Namespace) -> int:
    run_prefix(args)
    return 0
