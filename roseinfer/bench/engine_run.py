"""A workload through roseinfer's engine, timed (shared by `bench throughput` and `bench prefix`): the engine
options, the warm-up workload, the timed run."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from roseinfer.bench.device import sync
from roseinfer.bench.jit_watch import watch_triton_compiles
from roseinfer.bench.run_result import RunResult
from roseinfer.bench.workloads import Workload, build_workload
from roseinfer.config import DTYPE_CHOICES
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.arg_types import memory_fraction, torch_device
from roseinfer.kv.cache_dtype import KV_CACHE_DTYPES
from roseinfer.models.loader import DEFAULT_MODEL
from roseinfer.scheduler.policy import POLICIES

ENGINE_OPTIONS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "gpu_memory_utilization",
    "attention_backend",
    "num_kv_blocks",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "max_model_len",
    "async_scheduling",
    "fold_norms",
    "pdl_decode",
    "prefill_key_splits",
    "admission_policy",
    "mixed_graph_max_tokens",
    "kv_cache_dtype",
)
CPU_KV_TOKENS = 16384  # make_engine_config's default pool on the CPU; grown to fit the workload


def run_engine(engine: LLMEngine, workload: Workload, name: str) -> RunResult:
    """Add every request of `workload`, step until all finish; timed from the first add to the last step."""
    core = engine.core
    device = engine.config.device
    sync(device)
    core.stats.reset()
    paths_before = dict(core.runner.step_paths)
    with watch_triton_compiles() as compiled:
        t0 = time.perf_counter()
        for prompt, params in zip(workload.prompts, workload.params):
            engine.add_request(prompt, params)
        t_added = time.perf_counter()
        completion = 0
        decode_calls: list[float] = []  # wall time of each step() call that scheduled a pure decode step
        while engine.has_unfinished_requests():
            booked = core.stats.decode_time
            for out in engine.step(final_only=True):
                completion += sum(len(c.token_ids) for c in out.outputs)
            if core.stats.decode_time != booked:
                decode_calls.append(core.stats.decode_time - booked)
        sync(device)
        total = time.perf_counter() - t0
    if completion != workload.num_output_tokens:
        raise RuntimeError(
            f"{name}: {completion} completion tokens, the workload asked for {workload.num_output_tokens}"
        )
    stats = core.stats
    sched = engine.config.scheduler
    return RunResult(
        name=name,
        num_requests=workload.num_requests,
        prefill_time=total - stats.decode_time,
        decode_time=stats.decode_time,
        total_time=total,
        prompt_tokens=workload.num_prompt_tokens,
        completion_tokens=completion,
        extra={
            "add_time": t_added - t0,
            "prefill_step_time": stats.prefill_time,
            "device_wait_time": stats.device_wait_time,
            "num_steps": stats.num_steps,
            "num_prompt_tokens_computed": stats.num_prompt_tokens_computed,
            "num_preemptions": core.scheduler.num_preemptions,
            "num_kv_blocks": core.num_blocks,
            "num_decode_steps": len(decode_calls),
            "decode_step_median_s": statistics.median(decode_calls) if decode_calls else None,
            **compiled.report(),
            "scheduler": {
                "policy": sched.policy,
                "max_num_batched_tokens": sched.max_num_batched_tokens,
                "max_num_seqs": sched.max_num_seqs,
                "mixed_graph_max_tokens": core.runner.mixed_graph_max_tokens,
                "kv_cache_dtype": engine.config.cache.kv_cache_dtype,
            },
            "step_paths": {k: v - paths_before[k] for k, v in core.runner.step_paths.items()},
        },
    )


def warmup_workload(args: argparse.Namespace, workload: Workload, vocab_size: int) -> Workload:
    """The workload's requests with other token ids (another seed: nothing left in a prefix cache for the
    timed run to hit) and short outputs. By default every request: the warm-up then meets the timed run's
    prefill chunk and decode batch shapes, so that one-time costs (kernel compiles and autotuning,
    allocator growth) stay out of the timed run; a 4-request warm-up left ~1 s of them in W1's prefill."""
    n = args.warmup_requests if args.warmup_requests is not None else workload.num_requests
    n = min(n, workload.num_requests)
    out_len = args.warmup_output_len
    other = build_workload(
        workload.id,
        vocab_size,
        num_requests=n,
        max_prompt_len=args.max_prompt_len,
        max_output_len=min(args.max_output_len or out_len, out_len),
        seed=workload.seed + 1,
    )
    return other.head(n)


def engine_kwargs(args: argparse.Namespace, workload: Workload, mode: str) -> dict[str, Any]:
    """make_engine_config keywords: explicit options win over the workload's, which win over defaults."""
    kw: dict[str, Any] = {"load_format": "dummy", "dtype": args.dtype, "scheduler_mode": mode}
    kw.update(workload.engine_overrides)
    kw.update(engine_options(args))
    # On the CPU the pool is sized in tokens: make the whole workload fit, as it would on a GPU.
    block = kw.get("block_size", 16)
    need = sum(
        -(-(len(p) + s.max_tokens) // block) * block for p, s in zip(workload.prompts, workload.params)
    )
    kw["cpu_kv_tokens"] = max(CPU_KV_TOKENS, need)
    return kw


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The make_engine_config keywords of the options given on the command line (`add_engine_arguments`'s and
    `--device`); an option left out is not in the dict."""
    kw: dict[str, Any] = {}
    if args.device is not None:
        kw["device"] = args.device
    for name in ENGINE_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            kw[name] = value
    if args.enforce_eager:
        kw["enforce_eager"] = True
    return kw


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model an engine bench command builds (`--model-shape` or `--model`, dummy weights), its device and dtype."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--model-shape", default=None, help=f"built-in shape id (default {DEFAULT_MODEL})")
    src.add_argument("--model", default=None, help="HF model directory or config.json (dummy weights)")
    parser.add_argument("--device", default=None, type=torch_device)
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES)


def chosen_model(args: argparse.Namespace) -> tuple[str, str]:
    """(what to load, the shape's name for the report): `--model`, else `--model-shape`, else the default."""
    model = args.model or args.model_shape or DEFAULT_MODEL
    return model, os.path.basename(os.path.normpath(model)).removesuffix(".json")


def add_engine_arguments(parser: argparse.ArgumentParser, prefix_caching_flag: bool) -> None:
    """The engine options every bench command takes (read back by `engine_kwargs`)."""
    engine = parser.add_argument_group("engine")
    engine.add_argument("--max-num-seqs", type=int, default=None)
    engine.add_argument("--max-num-batched-tokens", type=int, default=None)
    engine.add_argument("--block-size", type=int, default=None)
    engine.add_argument("--gpu-memory-utilization", type=memory_fraction, default=None)
    engine.add_argument("--num-kv-blocks", type=int, default=None)
    engine.add_argument("--max-model-len", type=int, default=None)
    engine.add_argument("--attention-backend", default=None)
    engine.add_argument(
        "--kv-cache-dtype",
        default=None,
        choices=sorted(KV_CACHE_DTYPES),
        help="KV cache element type: auto (the model's, default) or fp8 (= fp8_e4m3; half the bytes) / fp8_e5m2",
    )
    engine.add_argument("--enforce-eager", action="store_true")
    engine.add_argument(
        "--mixed-graph-max-tokens",
        type=int,
        default=None,
        help="steps with prefill work of up to this many tokens replay CUDA graphs (0: eager; default: from the "
        "model's size, 4096 for qwen2.5-0.5b, 1024 for llama-3.1-8b)",
    )
    engine.add_argument(
        "--admission-policy",
        default=None,
        choices=POLICIES,
        help="waiting-queue order: fcfs (default), lpm (longest cached prefix), lof (longest max_tokens)",
    )
    if prefix_caching_flag:
        engine.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    engine.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    engine.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="schedule the next step while the current one runs (default on)",
    )
    engine.add_argument(
        "--fold-norms",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode steps without RMSNorm launches: norm weights folded into the linears (default on)",
    )
    engine.add_argument(
        "--pdl-decode",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode steps as a programmatic-dependent-launch chain of Triton kernels, sm_90+ (default on, "
        "where it applies: llama.decode_chain)",
    )
    engine.add_argument(
        "--prefill-key-splits",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="prefill attention cuts short chunks' keys over long cached prefixes across programs (default on)",
    )
