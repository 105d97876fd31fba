"""Offline throughput: one workload through the naive / static / continuous schedulers, and HF `generate`
on the same weights as the peer, with the roofline floor of the run when on a GPU.

    roseinfer bench throughput --model-shape qwen2.5-0.5b --workload W1 --mode all --peer hf

Report per mode, as the original notes printed it. "Elapsed (decode/run)" is the wall time of the engine
steps that held no prefill work (`EngineCore.stats.decode_time`); "Elapsed (prefill/add)" is everything
else of the timed run: adding the requests, the steps that held prefill work, the loop around them.
The two add up to "Elapsed (total)", the wall time of the timed run.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

from roseinfer.bench.device import free_memory
from roseinfer.bench.engine_run import (
    add_engine_arguments,
    add_model_arguments,
    chosen_model,
    engine_kwargs,
    run_engine,
    warmup_workload,
)
from roseinfer.bench.env import (
    bench_header,
    format_header,
    measure_copy_bandwidth,
    measure_matmul_tflops,
    write_json_report,
)
from roseinfer.bench.hf_peer import build_hf_model, export_to_hf, run_hf
from roseinfer.bench.roofline_floor import format_roofline, roofline_floor
from roseinfer.bench.run_result import RunResult
from roseinfer.bench.workloads import WORKLOADS, build_workload
from roseinfer.config import SCHEDULER_MODES
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.engine.startup import StartupReport
from roseinfer.entrypoints.arg_types import positive_int
from roseinfer.entrypoints.llm import make_engine_config
from roseinfer.kv.cache_dtype import resolve_kv_cache_dtype
from roseinfer.profiling import profile_to, trace_path_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--workload", default="W1", type=str.upper, choices=sorted(WORKLOADS))
    parser.add_argument("--mode", default="continuous", choices=[*SCHEDULER_MODES, "all"])
    parser.add_argument("--peer", choices=["hf"], default=None, help="also run HF generate, same weights")
    parser.add_argument(
        "--hf-batch-size", type=positive_int, default=None, help="HF batch (default: all if uniform, else 64)"
    )
    parser.add_argument("--num-requests", type=int, default=None, help="shrink the workload (quick runs)")
    parser.add_argument("--max-prompt-len", type=int, default=None, help="shrink prompt lengths")
    parser.add_argument("--max-output-len", type=int, default=None, help="shrink output lengths")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument(
        "--warmup-requests", type=positive_int, default=None, help="default: all of the workload's"
    )
    parser.add_argument(
        "--warmup-output-len", type=positive_int, default=4, help="output tokens per warm-up request"
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="write every number here")
    parser.add_argument("--no-roofline", action="store_true", help="skip measuring the device limits")
    parser.add_argument(
        "--profile",
        default=None,
        metavar="PATH",
        help="torch profiler trace of each mode's timed run, at PATH with the mode before its extension "
        "(trace.json -> trace.continuous.json; .json.gz is written gzipped)",
    )
    parser.add_argument(
        "--profile-gpu-only",
        action="store_true",
        help="trace GPU activity only (no CPU ops or ranges): kernel times at less host cost than a full trace",
    )
    add_engine_arguments(parser, prefix_caching_flag=True)


def run_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the command; prints the report and returns every number (also written to --json)."""
    model, shape = chosen_model(args)
    modes = list(SCHEDULER_MODES[::-1]) if args.mode == "all" else [args.mode]  # naive, static, continuous

    # The first config only resolves the model and device; each mode builds its own engine.
    probe, path = make_engine_config(model, load_format="dummy", dtype=args.dtype, device=args.device)
    model_config, device, dtype = probe.model_config, probe.device, probe.dtype
    workload = build_workload(
        args.workload,
        model_config.vocab_size,
        num_requests=args.num_requests,
        max_prompt_len=args.max_prompt_len,
        max_output_len=args.max_output_len,
        seed=args.seed,
    )
    header = bench_header(
        workload.id,
        shape,
        command=getattr(args, "argv", None),
        device=device,
        workload_description=workload.description,
        workload_scaled=workload.scaled,
        dtype=str(dtype).removeprefix("torch."),
        modes=",".join(modes),
        peer=args.peer or "none",
    )
    print(format_header(header), flush=True)

    # Device limits first: the engine takes most of the GPU memory for its KV cache.
    limits: tuple[float, float] | None = None
    if device.type == "cuda" and not args.no_roofline:
        mm_dtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        limits = (measure_copy_bandwidth(device), measure_matmul_tflops(device, mm_dtype))

    warmup = warmup_workload(args, workload, model_config.vocab_size)
    results: list[RunResult] = []
    shared_model: nn.Module | None = None
    max_num_seqs = 0
    # Did any run reuse prompt KV? Then the floor counts each distinct prompt token once.
    prefix_caching = False
    startup: dict[str, StartupReport] = {}
    for mode in modes:
        config, path = make_engine_config(model, **engine_kwargs(args, workload, mode))
        prefix_caching |= config.cache.enable_prefix_caching
        engine = LLMEngine(config, path, shared_model)
        startup[mode] = engine.core.startup
        print(f"{mode}: {startup[mode].line()}", flush=True)
        shared_model = engine.core.runner.model
        max_num_seqs = max(max_num_seqs, 1 if mode == "naive" else config.scheduler.max_num_seqs)
        run_engine(engine, warmup, f"{mode} (warm-up)")
        trace = trace_path_for(args.profile, mode) if args.profile else None
        with profile_to(trace, gpu_only=args.profile_gpu_only):
            result = run_engine(engine, workload, mode)
        results.append(result)
        print(result.report(), flush=True)
        del engine
        free_memory(device)

    hf_result: RunResult | None = None
    if args.peer == "hf":
        assert shared_model is not None
        hf_model = build_hf_model(model_config, dtype, device)
        export_to_hf(shared_model, hf_model)
        shared_model = None
        free_memory(device)
        run_hf(hf_model, warmup, device, args.hf_batch_size)
        hf_result = run_hf(hf_model, workload, device, args.hf_batch_size)
        print(hf_result.report(), flush=True)
        for r in results:
            ratio = r.completion_throughput / hf_result.completion_throughput
            print(f"Ratio roseinfer/HF (completion tok/s), {r.name}: {ratio:.2f}x")
        del hf_model
        free_memory(device)

    floor: dict[str, float] | None = None
    if limits is not None:
        kv_dtype = resolve_kv_cache_dtype(args.kv_cache_dtype or "auto", dtype)
        floor = roofline_floor(
            model_config,
            dtype,
            workload,
            max(max_num_seqs, 1),
            *limits,
            kv_dtype=kv_dtype,
            prefix_caching=prefix_caching,
        )
        print(format_roofline(floor, results + ([hf_result] if hf_result else [])), flush=True)

    report: dict[str, Any] = {
        "header": header,
        "workload": workload.summary(),
        "results": {r.name: r.to_dict() for r in results},
        "peer": hf_result.to_dict() if hf_result else None,
        "ratio_to_hf": (
            {r.name: r.completion_throughput / hf_result.completion_throughput for r in results}
            if hf_result
            else None
        ),
        "roofline": floor,
        "startup": {mode: report.to_dict() for mode, report in startup.items()},
    }
    if args.json:
        write_json_report(args.json, report)
    return report


def run(args: argparse.Namespace) -> int:
    run_throughput(args)
    return 0
