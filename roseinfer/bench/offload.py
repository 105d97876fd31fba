"""`roseinfer bench offload`: W6 (hit-rate sweep) and W7 (long-prompt rounds) over the cache configurations
of WORKLOADS.md: none (no prefix cache), gpu, gpu+cpu (GPU prefix cache with the CPU tier), cpu (the CPU tier
only: the GPU cache as if thrashed). One engine per configuration, on one set of dummy weights; every
timed point starts on a cold cache (GPU and CPU). Each run's floor for its loads is the bytes loaded over
the pinned host-to-device bandwidth measured in the same process."""

from __future__ import annotations

import argparse
import time
from typing import Any, Protocol

import numpy as np
from tqdm.auto import tqdm

from roseinfer.bench.device import free_memory, sync
from roseinfer.bench.engine_run import add_engine_arguments, add_model_arguments, chosen_model, engine_options
from roseinfer.bench.env import bench_header, format_header, write_json_report
from roseinfer.bench.jit_watch import format_compiles, watch_triton_compiles
from roseinfer.bench.offload_report import (
    format_beside_peer,
    format_w6,
    format_w7,
    measure_h2d_bandwidth,
    plot_offload,
)
from roseinfer.bench.vllm_peer import add_peer_option, peer_failed
from roseinfer.bench.workloads import token_id_range
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.arg_types import non_negative_float, positive_int
from roseinfer.entrypoints.llm import make_engine_config
from roseinfer.profiling import profile_to, trace_path_for
from roseinfer.runner.gc_heap import release_dead_engines
from roseinfer.sampling_params import SamplingParams

CONFIGS = ("none", "gpu", "gpu+cpu", "cpu")
STEP_BUDGET = 1024  # both workloads' step token budget
W7_OUTPUTS = (2, 4, 8, 16, 32, 64, 128)
NUM_REQUESTS = {"W6": 1000, "W7": 10}  # WORKLOADS.md's, unless --num-requests shrinks them
PROMPT_LEN = {"W6": 1000, "W7": 10240}
WARM_UP_MAX_REQUESTS = 256


def config_kwargs(name: str, offload_gib: float) -> dict[str, Any]:
    return {
        "none": {"enable_prefix_caching": False},
        "gpu": {"enable_prefix_caching": True},
        "gpu+cpu": {"enable_prefix_caching": True, "kv_offloading_size": offload_gib},
        "cpu": {"enable_prefix_caching": True, "kv_offloading_size": offload_gib, "gpu_prefix_reuse": False},
    }[name]


def random_prompts(n: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    low, high = token_id_range(vocab_size)
    rng = np.random.default_rng(seed)
    return rng.integers(low, high, size=(n, length)).tolist()


def run_batch(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int]:
    """Seconds to run `prompts` to completion together, and the Triton kernels compiled meanwhile."""
    sync(engine.config.device)
    with watch_triton_compiles() as compiled:
        t0 = time.perf_counter()
        for p in prompts:
            engine.add_request(p, params)
        while engine.has_unfinished_requests():
            engine.step(final_only=True)
        sync(engine.config.device)
        seconds = time.perf_counter() - t0
    return seconds, sum(compiled.values())


class Target(Protocol):
    """What the workloads drive: roseinfer's engine here, vLLM's in `offload_vllm`."""

    def clear(self) -> None:
        """Cold caches, GPU and CPU."""

    def run(self, prompts: list[list[int]], max_tokens: int, trace: str | None = None) -> dict[str, Any]:
        """Runs `prompts` to completion together, greedy, `max_tokens` each: "seconds" and counters; `trace`: a
        profiler trace of the run goes there, where the target can trace itself."""
        ...


class EngineTarget:
    """roseinfer's engine, with the prefix tokens served from its cache and loaded from its CPU tier in each run."""

    def __init__(self, engine: LLMEngine, trace_gpu_only: bool = False) -> None:
        self.engine = engine
        self.trace_gpu_only = trace_gpu_only

    def clear(self) -> None:
        self.engine.core.kv.reset_prefix_cache()

    def run(self, prompts: list[list[int]], max_tokens: int, trace: str | None = None) -> dict[str, Any]:
        counters = Counters(self.engine)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        with profile_to(trace, gpu_only=self.trace_gpu_only):
            seconds, compiles = run_batch(self.engine, prompts, params)
        return {"seconds": seconds, "compiles": compiles} | counters.read()


def point_trace(args: argparse.Namespace, point: str) -> str | None:
    """Where a traced point's trace goes: --profile's path (the configuration's, by now) with the point added."""
    path = getattr(args, "profile", None)
    return trace_path_for(path, point) if path else None


class Counters:
    """Prefix tokens served from the cache and loaded from the CPU tier during one run."""

    def __init__(self, engine: LLMEngine) -> None:
        self.core = engine.core
        self.kv = engine.core.kv
        self.hit0, self.loaded0 = self.kv.num_hit_tokens, self.kv.num_loaded_tokens
        self.core.stats.reset()
        self.preemptions0 = self.core.scheduler.num_preemptions

    def read(self) -> dict[str, Any]:
        stats = self.core.stats
        return {
            "hit_tokens": self.kv.num_hit_tokens - self.hit0,
            "loaded_tokens": self.kv.num_loaded_tokens - self.loaded0,
            "steps": stats.num_steps,
            "device_wait_s": stats.device_wait_time,
            "prefill_s": stats.prefill_time,
            "preemptions": self.core.scheduler.num_preemptions - self.preemptions0,
        }


def bench_w6(target: Target, args: argparse.Namespace, vocab: int, progress: bool) -> list[dict[str, Any]]:
    n, length, out = (
        args.num_requests or NUM_REQUESTS["W6"],
        args.prompt_len or PROMPT_LEN["W6"],
        args.output_len or 24,
    )
    prompts = random_prompts(n, length, vocab, args.seed)
    rows = []
    for h in tqdm(args.hit_rates, desc="W6 h", disable=not progress, leave=False):
        target.clear()
        k = int(round(h * length))
        if k:
            target.run([p[:k] for p in prompts], 1)  # the first h of each prompt, seen before
        traced = h in (args.hit_rates[0], args.hit_rates[-1])
        ran = target.run(prompts, out, point_trace(args, f"W6.h{h:g}") if traced else None)
        rows.append({"h": h, "req_per_s": n / ran["seconds"]} | ran)
    return rows


def bench_w7(target: Target, args: argparse.Namespace, vocab: int, progress: bool) -> list[dict[str, Any]]:
    n, length = args.num_requests or NUM_REQUESTS["W7"], args.prompt_len or PROMPT_LEN["W7"]
    prompts = random_prompts(n, length, vocab, args.seed + 7)
    rows = []
    points = [(o, r) for o in args.outputs for r in range(1, 4)]
    for out, round_ in tqdm(points, desc="W7 N,round", disable=not progress, leave=False):
        if round_ == 1:
            target.clear()
        traced = out == args.outputs[0]
        ran = target.run(prompts, out, point_trace(args, f"W7.N{out}.r{round_}") if traced else None)
        rows.append({"N": out, "round": round_, "req_per_s": n / ran["seconds"]} | ran)
    return rows


def warm_up(target: Target, workload: str, args: argparse.Namespace, vocab: int) -> None:
    """Kernel compiles and autotuning outside the timed runs: the workload itself on other tokens, over the shapes
    that meet new kernel variants (W6: a partial and a whole hit, whose short chunks over long cached prefixes
    split their keys by how many there are in a step; W7: the three rounds), with as many requests as run at
    once (a W6 warm-up of 16 requests left a 0.6 s compile in a timed whole-hit run of 100)."""
    small = argparse.Namespace(**vars(args))
    # The workload's own count: W7's 10 prompts, not W6's 1000 (256 prompts of 10240 tokens overflowed an H200's
    # cache of llama-3.1-8b and took 262 s, a hundred times its timed rounds).
    small.num_requests = min(args.num_requests or NUM_REQUESTS[workload], WARM_UP_MAX_REQUESTS)
    small.seed = args.seed + 1000
    small.hit_rates, small.outputs = [0.5, 1.0], [2]
    small.profile = None
    (bench_w6 if workload == "W6" else bench_w7)(target, small, vocab, False)


def stage(what: str, since: float, detail: str = "") -> None:
    """A line a stage, flushed, so that a log cut short by a time limit still says where the time went."""
    print(f"# {what} in {time.perf_counter() - since:.1f} s" + (f"; {detail}" if detail else ""), flush=True)


def run_offload(args: argparse.Namespace) -> dict[str, Any]:
    model, shape = chosen_model(args)
    workloads = ["W6", "W7"] if args.workload == "all" else [args.workload]
    base = {"load_format": "dummy", "dtype": args.dtype, "max_num_batched_tokens": STEP_BUDGET}
    base.update(engine_options(args))
    probe, _ = make_engine_config(model, **base)
    progress = not args.no_progress
    scaled = any(v is not None for v in (args.num_requests, args.prompt_len, args.output_len))
    header = bench_header(
        ",".join(workloads),
        shape,
        command=getattr(args, "argv", None),
        device=probe.device,
        dtype=str(probe.dtype).removeprefix("torch."),
        compare=f"configurations {', '.join(args.configs)}; CPU tier {args.kv_offloading_size:g} GiB"
        + ("; each beside vLLM's (--peer vllm)" if args.peer else ""),
        scaled=scaled or args.hit_rates != DEFAULT_HIT_RATES or tuple(args.outputs) != W7_OUTPUTS,
    )
    print(format_header(header), flush=True)
    h2d = measure_h2d_bandwidth(probe.device)
    vocab = probe.model_config.vocab_size
    results: dict[str, Any] = {w: {} for w in workloads}
    shared = None
    info: dict[str, Any] = {"h2d_bytes_per_s": h2d}

    def save_so_far(peer: dict[str, Any] | None = None) -> None:  # in case a time limit cuts the rest
        if args.json:
            so_far = {"header": header, "info": info, "results": results, "plots": {}}
            write_json_report(args.json, so_far | ({"peer": peer} if peer is not None else {}))

    for name in args.configs:
        t0 = time.perf_counter()
        kw = base | config_kwargs(name, args.kv_offloading_size)
        config, path = make_engine_config(model, **kw)
        engine = LLMEngine(config, path, shared)
        target = EngineTarget(engine, trace_gpu_only=args.profile_gpu_only)
        own = argparse.Namespace(
            **vars(args)
        )  # the configuration's traces: trace.json -> trace.gpu_cpu.W7....json
        own.profile = trace_path_for(args.profile, name.replace("+", "_")) if args.profile else None
        stage(f"{name}: engine ready", t0)
        shared = engine.core.runner.model
        info["kv_bytes_per_token"] = engine.core.runner.block_bytes() // config.cache.block_size
        info.setdefault("gpu_blocks", {})[name] = engine.core.num_blocks
        cpu = engine.core.kv.cpu
        info.setdefault("cpu_blocks", {})[name] = cpu.num_slots if cpu is not None else 0
        for w in workloads:
            t0 = time.perf_counter()
            with watch_triton_compiles() as compiled:
                warm_up(target, w, args, vocab)
            stage(f"{name}: {w} warm-up", t0, format_compiles(compiled, compiled.total_seconds(), "in it"))
            info.setdefault("warm_up", {}).setdefault(w, {})[name] = {
                "seconds": time.perf_counter() - t0,
                **compiled.report(),
                "variants": compiled.variants,
            }
            save_so_far()
            t0 = time.perf_counter()
            bench = bench_w6 if w == "W6" else bench_w7
            results[w][name] = rows = bench(target, own, vocab, progress)
            stage(f"{name}: {w} timed runs", t0, "req/s " + ", ".join(f"{r['req_per_s']:.2f}" for r in rows))
            save_so_far()
        del engine, target
        free_memory(probe.device)
    report: dict[str, Any] = {"header": header, "info": info, "results": results, "plots": {}}
    if args.peer == "vllm":
        del shared  # vLLM sizes its cache by the memory free when it starts
        release_dead_engines(probe.device)
        from roseinfer.bench.offload_vllm import run_vllm  # it imports this module's workloads

        report["peer"] = run_vllm(args, model, vocab, probe, workloads, save=save_so_far)
    texts = []
    if "W6" in results:
        texts.append(format_w6(results["W6"], info))
    if "W7" in results:
        texts.append(format_w7(results["W7"], info))
    peer_results = report.get("peer", {}).get("results", {})
    for w in workloads:
        if peer_results.get(w):
            texts.append(format_beside_peer(w, results[w], peer_results[w], report["peer"]["version"]))
    print("\n\n".join(texts), flush=True)
    if args.json:
        report["plots"] = plot_offload(report, args.json)
        for p in report["plots"].values():
            print(f"plot: {p}", flush=True)
        write_json_report(args.json, report)
    return report


DEFAULT_HIT_RATES = [round(0.1 * i, 1) for i in range(11)]


def parse_list(kind: type) -> Any:
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from e

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--workload", default="all", choices=["W6", "W7", "all"])
    parser.add_argument(
        "--configs",
        type=parse_list(str),
        default=list(CONFIGS),
        help="comma-separated, from none,gpu,gpu+cpu,cpu",
    )
    parser.add_argument(
        "--kv-offloading-size", type=non_negative_float, default=16.0, help="CPU tier GiB (default 16)"
    )
    parser.add_argument("--hit-rates", type=parse_list(float), default=DEFAULT_HIT_RATES, help="W6 h values")
    parser.add_argument("--outputs", type=parse_list(int), default=list(W7_OUTPUTS), help="W7 output lengths")
    parser.add_argument(
        "--num-requests",
        type=positive_int,
        default=None,
        help=f"shrink: W6 {NUM_REQUESTS['W6']}, W7 {NUM_REQUESTS['W7']}",
    )
    parser.add_argument(
        "--prompt-len",
        type=positive_int,
        default=None,
        help=f"shrink: W6 {PROMPT_LEN['W6']}, W7 {PROMPT_LEN['W7']}",
    )
    parser.add_argument("--output-len", type=positive_int, default=None, help="shrink W6's 24 output tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="write every number here (plots beside it)"
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--profile",
        default=None,
        metavar="PATH",
        help="torch profiler traces of each configuration's rounds at W7's first output length and of W6's first "
        "and last h, at PATH with the configuration and point before its extension (trace.json -> "
        "trace.gpu_cpu.W7.N2.r1.json; .json.gz is written gzipped)",
    )
    parser.add_argument(
        "--profile-gpu-only",
        action="store_true",
        help="trace GPU activity only (kernel times, less host cost)",
    )
    add_peer_option(
        parser,
        "each configuration's points (its LLM.generate, timed the same way; `cpu` as its GPU cache reset before each run)",
    )
    add_engine_arguments(parser, prefix_caching_flag=False)


def check_arguments(args: argparse.Namespace) -> None:
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown or not args.configs:
        raise ValueError(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGS)}")
    if any("cpu" in c for c in args.configs) and args.kv_offloading_size <= 0:
        raise ValueError("the gpu+cpu and cpu configurations need --kv-offloading-size > 0")
    if any(not 0.0 <= h <= 1.0 for h in args.hit_rates) or not args.hit_rates:
        raise ValueError(f"--hit-rates must lie in [0, 1], got {args.hit_rates}")
    if any(o < 1 for o in args.outputs) or not args.outputs:
        raise ValueError(f"--outputs must be >= 1, got {args.outputs}")


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    return 1 if peer_failed(run_offload(args)) else 0
