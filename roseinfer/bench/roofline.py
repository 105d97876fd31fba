"""`roseinfer bench roofline`: decode and prefill step times as multiples of the hardware floor.

The floor of a decode step is (weight bytes read + KV bytes read) / measured copy bandwidth; the floor
of a prefill of N tokens is its matmul FLOPs (2 x linear params x N, plus causal attention) / measured
bf16 matmul rate. Both ceilings are measured in the same run.

A decode step is timed two ways: alone (synchronized, so the device idles while the host stages the step's
inputs, inside the timing) and steady (steps called back to back, as the engine's decode loop calls them).
A prefill runs as the engine would run it: replayed as a mixed-step CUDA graph where one holds its tokens,
else eagerly.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from roseinfer.bench.env import (
    back_to_back_time,
    bench_header,
    format_header,
    measure_copy_bandwidth,
    measure_matmul_tflops,
    median_time,
    write_json_report,
)
from roseinfer.bench.plots import plot_roofline, report_plot_path
from roseinfer.config import DTYPE_CHOICES, ModelConfig
from roseinfer.entrypoints.arg_types import memory_fraction
from roseinfer.entrypoints.llm import LLM
from roseinfer.kv.cache_dtype import KV_CACHE_DTYPES
from roseinfer.models.layers import ForwardContext
from roseinfer.runner.inputs import HostStep, upload_step


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-shape", default="qwen2.5-0.5b")
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--contexts", default="1024,4096")
    parser.add_argument("--prefill-tokens", default="512,2048,8192")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPE_CHOICES)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--kv-cache-dtype", default="auto", choices=sorted(KV_CACHE_DTYPES))
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument(
        "--one-token-gemv",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="batch-1 decode as fused GEMVs (default on); --no-one-token-gemv times cuBLAS + separate kernels",
    )
    parser.add_argument(
        "--fold-norms",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="decode steps without RMSNorm launches (default on); --no-fold-norms times them with the launches",
    )
    parser.add_argument(
        "--pdl-decode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="decode steps as a PDL chain of Triton kernels (default on, where it applies: llama.decode_chain)",
    )
    parser.add_argument("--gpu-memory-utilization", type=memory_fraction, default=0.9)
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="write every number here (the plot beside it)"
    )
    parser.add_argument(
        "--plot",
        default=None,
        metavar="PNG",
        help="draw the report here (default: beside --json as <base>.roofline.png; needs matplotlib)",
    )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def weight_bytes_per_decode(cfg: ModelConfig, elem: int) -> int:
    """Bytes of weights a decode step must read: everything but the input embedding table of an untied model
    (it reads only a few rows of that)."""
    total = cfg.params_count()
    if not cfg.tie_word_embeddings:
        total -= cfg.vocab_size * cfg.hidden_size
    return total * elem


def prefill_flops(cfg: ModelConfig, n: int) -> float:
    h, d = cfg.hidden_size, cfg.head_dim
    linear = cfg.num_layers * (
        h * d * (cfg.num_heads + 2 * cfg.num_kv_heads)
        + cfg.num_heads * d * h
        + (2 if cfg.model_type == "gpt2" else 3) * h * cfg.intermediate_size
    )
    attention = cfg.num_layers * cfg.num_heads * d * 2 * n * n  # QK^T and PV over the causal half
    return 2.0 * linear * n + attention + 2.0 * cfg.vocab_size * h  # logits of the last token only


def decode_floor_bytes(cfg: ModelConfig, elem: int, kv_dtype: torch.dtype, batch: int, context: int) -> int:
    """Bytes a decode step of `batch` sequences, each attending over `context` tokens, must read: the weights
    once and every sequence's KV."""
    return weight_bytes_per_decode(cfg, elem) + batch * context * cfg.kv_bytes_per_token(kv_dtype)


def decode_row(
    batch: int, context: int, graph: bool, seconds: float, steady: float, floor_bytes: int, bandwidth: float
) -> dict[str, Any]:
    """A decode step's report row: its times against the byte floor at `bandwidth` (bytes/s)."""
    floor = floor_bytes / bandwidth
    return {
        "kind": "decode",
        "batch": batch,
        "context": context,
        "graph": graph,
        "ms": seconds * 1e3,
        "floor_ms": floor * 1e3,
        "x_floor": seconds / floor,
        "achieved_TBps": floor_bytes / seconds / 1e12,
        "steady_ms": steady * 1e3,
        "steady_x_floor": steady / floor,
    }


def prefill_row(n: int, graph: bool, seconds: float, flops: float, tflops: float) -> dict[str, Any]:
    """A prefill's report row: its time against the FLOP floor at `tflops` (TFLOP/s)."""
    floor = flops / (tflops * 1e12)
    return {
        "kind": "prefill",
        "tokens": n,
        "graph": graph,
        "ms": seconds * 1e3,
        "floor_ms": floor * 1e3,
        "x_floor": seconds / floor,
        "achieved_TFLOPs": flops / seconds / 1e12,
        "pct_matmul_rate": 100 * flops / seconds / 1e12 / tflops,
    }


def _time(fn, iters: int) -> float:
    """Median seconds of `fn` over `iters` CUDA-event-timed runs after 3 warm-ups."""
    return median_time(fn, torch.device("cuda", torch.cuda.current_device()), warmup=3, repeats=iters)


def _time_steady(fn, iters: int) -> float:
    """Seconds per call of `fn` called `iters` times back to back (median of 5 rounds, after 3 warm-ups)."""
    return back_to_back_time(fn, torch.device("cuda", torch.cuda.current_device()), warmup=3, repeats=iters)


def decode_step(batch: int, context: int, block_size: int, vocab: int, rng: np.random.Generator) -> HostStep:
    per_seq = -(-context // block_size)
    tables = np.arange(batch * per_seq, dtype=np.int32).reshape(batch, per_seq)
    pos = context - 1
    slots = tables[:, pos // block_size] * block_size + pos % block_size
    return HostStep(
        input_ids=rng.integers(1000, min(vocab, 32000), batch).astype(np.int32),
        positions=np.full(batch, pos, np.int32),
        slot_mapping=slots.astype(np.int32),
        query_start_loc=np.arange(batch + 1, dtype=np.int32),
        seq_lens=np.full(batch, context, np.int32),
        logits_index=np.arange(batch, dtype=np.int32),
        block_tables=tables,
        max_query_len=1,
    )


def prefill_step(n: int, block_size: int, vocab: int, rng: np.random.Generator) -> HostStep:
    blocks = -(-n // block_size)
    return HostStep(
        input_ids=rng.integers(1000, min(vocab, 32000), n).astype(np.int32),
        positions=np.arange(n, dtype=np.int32),
        slot_mapping=np.arange(n, dtype=np.int32),
        query_start_loc=np.array([0, n], np.int32),
        seq_lens=np.array([n], np.int32),
        logits_index=np.array([n - 1], np.int32),
        block_tables=np.arange(blocks, dtype=np.int32)[None],
        max_query_len=n,
    )


@torch.inference_mode()
def run_roofline(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda")
    header = bench_header("roofline", args.model_shape, device=device)
    print(format_header(header), flush=True)
    bandwidth = measure_copy_bandwidth(device)
    tflops = measure_matmul_tflops(device)
    print(
        f"# measured copy bandwidth {bandwidth / 1e12:.2f} TB/s, bf16 matmul {tflops:.0f} TFLOP/s", flush=True
    )
    batches, contexts, prefills = _ints(args.batches), _ints(args.contexts), _ints(args.prefill_tokens)
    max_len = max(max(contexts), max(prefills)) + args.block_size
    llm = LLM(
        args.model_shape,
        load_format="dummy",
        dtype=args.dtype,
        block_size=args.block_size,
        kv_cache_dtype=args.kv_cache_dtype,
        max_num_seqs=max(batches),
        max_num_batched_tokens=max(prefills),
        max_model_len=max_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        one_token_gemv=args.one_token_gemv,
        fold_norms=args.fold_norms,
        pdl_decode=args.pdl_decode,
        enable_prefix_caching=False,
    )
    core = llm.engine.core
    runner, cfg = core.runner, core.runner.cfg
    elem = torch.empty((), dtype=runner.dtype).element_size()
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []

    def eager_logits(step: HostStep) -> torch.Tensor:
        ids, pos, meta, _ = upload_step(step, runner.staging)
        hidden = runner.model(ids, pos, ForwardContext(runner.kv_cache, meta, runner.backend))
        return runner.model.compute_logits(
            hidden[-step.num_seqs :] if step.max_query_len == 1 else hidden[-1:]
        )

    def prefill_call(step: HostStep) -> tuple[Callable[[], torch.Tensor], bool]:
        """The prefill as the engine runs it: a mixed-step CUDA graph where one holds it, else eagerly."""
        mixed = runner.mixed_graphs
        plan = mixed.plan(step) if mixed is not None else None
        if mixed is None or plan is None:
            return partial(eager_logits, step), False
        return lambda: runner.model.compute_logits(mixed.run(step, plan, None)), True

    for context in contexts:
        for batch in batches:
            step = decode_step(batch, context, args.block_size, cfg.vocab_size, rng)
            if step.block_tables.size > core.num_blocks:
                rows.append(
                    {"kind": "decode", "batch": batch, "context": context, "skipped": "KV does not fit"}
                )
                continue
            graphs = runner.graphs
            use_graph = graphs is not None and graphs.can_run(step)
            if use_graph:
                run_step = partial(graphs.run, step, None)
            else:
                run_step = partial(eager_logits, step)
            seconds = _time(run_step, args.iters)
            steady = _time_steady(run_step, args.iters)
            floor_bytes = decode_floor_bytes(cfg, elem, runner.kv_dtype, batch, context)
            rows.append(decode_row(batch, context, use_graph, seconds, steady, floor_bytes, bandwidth))
            print(rows[-1], flush=True)
    for n in prefills:
        if -(-n // args.block_size) > core.num_blocks:
            rows.append({"kind": "prefill", "tokens": n, "skipped": "KV does not fit"})
            continue
        step = prefill_step(n, args.block_size, cfg.vocab_size, rng)
        run_prefill, graphed = prefill_call(step)
        seconds = _time(run_prefill, max(5, args.iters // 5))
        rows.append(prefill_row(n, graphed, seconds, prefill_flops(cfg, n), tflops))
        print(rows[-1], flush=True)
    result = {
        "header": header,
        "bandwidth_TBps": bandwidth / 1e12,
        "matmul_TFLOPs": tflops,
        "one_token_gemv": args.one_token_gemv,
        "fold_norms": args.fold_norms,
        "pdl_decode": args.pdl_decode,
        "rows": rows,
    }
    print(format_table(result))
    if args.json:
        write_json_report(args.json, result, indent=1)
    plot_path = roofline_plot_path(args.json, args.plot)
    if plot_path:
        made = plot_roofline(result, plot_path)
        print(
            f"plot: {made}"
            if made
            else "plot: skipped, matplotlib is not installed (`bench plot` draws the json later)"
        )
    return result


def roofline_plot_path(json_path: str | None, plot: str | None) -> str | None:
    """Where `bench roofline` draws its plot: --plot, else beside --json, else nowhere."""
    if plot:
        return plot
    return report_plot_path(json_path, "roofline") if json_path else None


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"roofline {result['header']['model_shape']} on {result['header']['device']}"
        f" (copy {result['bandwidth_TBps']:.2f} TB/s, matmul {result['matmul_TFLOPs']:.0f} TFLOP/s)"
        + ("" if result.get("one_token_gemv", True) else ", batch 1 without the fused GEMV")
        + ("" if result.get("fold_norms", True) else ", decode with RMSNorm launches")
        + ("" if result.get("pdl_decode", True) else ", decode without PDL"),
        "ms: one step at a time, the host's staging inside the timing; steady: decode steps back to back, the"
        " host staging each while the device runs the one before (as the engine's decode loop runs them)",
        f"{'step':<24}{'ms':>10}{'floor ms':>10}{'x floor':>9}{'steady ms':>11}{'x floor':>9}  note",
    ]
    for r in result["rows"]:
        name = (
            f"decode b={r['batch']} ctx={r['context']}" if r["kind"] == "decode" else f"prefill {r['tokens']}"
        )
        if "skipped" in r:
            lines.append(f"{name:<24}{'-':>10}{'-':>10}{'-':>9}{'-':>11}{'-':>9}  {r['skipped']}")
            continue
        note = (
            (f"{r['achieved_TBps']:.2f} TB/s" + (" graph" if r["graph"] else " eager"))
            if r["kind"] == "decode"
            else f"{r['achieved_TFLOPs']:.0f} TFLOP/s = {r['pct_matmul_rate']:.0f}% of matmul rate"
            + {True: " graph", False: " eager", None: ""}[r.get("graph")]
        )
        steady = (
            f"{r['steady_ms']:>11.3f}{r['steady_x_floor']:>9.2f}"
            if "steady_ms" in r
            else f"{'-':>11}{'-':>9}"
        )
        lines.append(f"{name:<24}{r['ms']:>10.3f}{r['floor_ms']:>10.3f}{r['x_floor']:>9.2f}{steady}  {note}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise SystemExit("bench roofline needs a CUDA GPU")
    run_roofline(args)
    return 0
