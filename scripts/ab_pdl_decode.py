"""Decode steps with and without the PDL chain (`pdl_decode`), two engines in one process, alternating.

`bench roofline` times one engine per process, and its decode figures move up to ~7% between runs of one
tree; this puts both engines in one process on the same (dummy) weights and step, and times:
- `replay`: the step's captured CUDA graph replayed back to back (GPU time only, CUDA events);
- `run`: `DecodeGraphs.run` as the engine calls it (inputs staged and uploaded, then the replay);
- with `--kernels`, device us per step by kernel (torch profiler, CUDA activity only);
- with `--timeline`, each kernel of a layer in order: the us it adds to the step, its span, and how early it
  started (PDL), medians over the layers.

    python scripts/ab_pdl_decode.py --model-shape qwen2.5-0.5b --batches 16,64 --context 1024

Engines: `pdl` (the chain), `plain` (no chain: torch's GEMMs), `nopdl` (the chain's kernels, launched without
PDL: with `--kernels`, their own times, which PDL's overlap hides), `pdl-no-attention`, `pdl-no-silu`,
`pdl-no-gemm` (the chain with that kind of kernel launched without PDL), and `pdl-exit`, `pdl-attention-exit`,
`pdl-silu-exit`, `pdl-gemm-exit`, `pdl-attention-silu-exit` (PDL, but those kernels let the next launch only as
their programs exit), `pdl-no-tail` / `pdl-tail-exit` (the final norm, the lm_head and the sampler without PDL /
letting the next launch only at exit) and `pdl-unfused-tail` (the lm_head on cuBLAS, then `sample_tokens`).
`--chain-rows N [--chain-attention-rows M]` replace the model width's own chain (`llama.decode_chain`) by one
over steps of up to N rows, with decode attention in it at up to M rows (default 0); `--programs-per-sm P` sets
decode attention's split target (`paged_decode_split`) for every engine. An engine name may end in modifiers of
the chain's GEMM tiles: `+spread` gives GEMMs whose grid fits one program an SM enough pipeline stages that no
two programs share an SM; `+NxK[@BM]=bn/bk/split/stages` fixes the tile of the N x K weight (at BM padded rows).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
import torch
import triton

from roseinfer.bench.roofline import decode_step
from roseinfer.entrypoints.llm import LLM
from roseinfer.kernels import (
    activation,
    logits_sample,
    paged_decode_attention,
    paged_decode_split,
    rmsnorm,
    skinny_gemm,
)
from roseinfer.kernels.pdl import RELEASE_AT_EXIT, pdl_active
from roseinfer.models import llama

# engine: the kernel modules whose launches it makes without PDL, or (`-exit`) with PDL but letting the next
# kernel launch only as each program exits
ALL_MODULES = (paged_decode_attention, activation, skinny_gemm)
PATCHED = {"nopdl": ALL_MODULES, "pdl-no-attention": (paged_decode_attention,), "pdl-no-silu": (activation,),
           "pdl-no-gemm": (skinny_gemm,), "pdl-exit": ALL_MODULES,
           "pdl-attention-exit": (paged_decode_attention,), "pdl-silu-exit": (activation,),
           "pdl-gemm-exit": (skinny_gemm,), "pdl-attention-silu-exit": (paged_decode_attention, activation),
           "pdl-no-tail": (rmsnorm, logits_sample), "pdl-tail-exit": (rmsnorm, logits_sample),
           "pdl-no-final-norm": (rmsnorm,), "pdl-no-logits": (logits_sample,)}  # fmt: skip
ENGINES = {"pdl", "plain", "pdl-unfused-tail", *PATCHED}


def patched_kwargs(name: str):
    if name.endswith("-exit"):
        return lambda pdl: {"PDL": RELEASE_AT_EXIT, "launch_pdl": True} if pdl_active(pdl) else {"PDL": False}
    return lambda pdl: {"PDL": False}


HALF_AN_SM_SMEM = 116 * 1024  # an H100 SM has 228 KiB of shared memory, 1 KiB of it reserved a program


def spread_tile(tile_rule):
    """`tile_rule` with enough pipeline stages that two programs cannot share an SM, where the grid fits one
    program an SM: does co-residency of a GEMM's programs (placed while the kernel before still runs) slow it?"""

    def rule(n: int, k: int, sms: int, block_m: int = skinny_gemm.MAX_ROWS) -> skinny_gemm.GemmTile:
        tile = tile_rule(n, k, sms, block_m)
        if triton.cdiv(n, tile.block_n) * tile.split > sms:
            return tile
        # bf16; Triton's pipeline held stages - 1 buffers in the compiled kernels checked (16-32 rows)
        stage_bytes = (block_m + tile.block_n) * tile.block_k * 2
        stages = max(tile.num_stages, HALF_AN_SM_SMEM // stage_bytes + 2)
        return dataclasses.replace(tile, num_stages=stages) if stages <= 12 else tile

    return rule


def fixed_tile(tile_rule, spec: str):
    """`tile_rule`, but `spec` = `NxK[@BLOCK_M]=block_n/block_k/split/stages` for that weight (and padded rows)."""
    shape, tile = spec.split("=")
    shape, _, rows = shape.partition("@")
    n0, k0 = (int(v) for v in shape.split("x"))
    block_n, block_k, split, stages = (int(v) for v in tile.split("/"))
    fixed = skinny_gemm.GemmTile(block_n, block_k, split, num_stages=stages)

    def rule(n: int, k: int, sms: int, block_m: int = skinny_gemm.MAX_ROWS) -> skinny_gemm.GemmTile:
        if (n, k) == (n0, k0) and (not rows or block_m == int(rows)):
            return fixed
        return tile_rule(n, k, sms, block_m)

    return rule


def engine(shape: str, name: str, max_batch: int, context: int) -> LLM:
    blocks = max_batch * (-(-context // 16) + 1) + 16
    if "+" in name:  # tiles are chosen as the graphs are captured, at start-up
        name, modifier = name.rsplit("+", 1)
        rule = skinny_gemm.skinny_tile
        skinny_gemm.skinny_tile = spread_tile(rule) if modifier == "spread" else fixed_tile(rule, modifier)
        skinny_gemm._default_tile.cache_clear()
        try:
            return engine(shape, name, max_batch, context)
        finally:
            skinny_gemm.skinny_tile = rule
            skinny_gemm._default_tile.cache_clear()
    if name == "pdl-unfused-tail":  # the chain, then the lm_head and the sampler off it
        fused = llama.LlamaForCausalLM.forward_sample
        llama.LlamaForCausalLM.forward_sample = lambda *args, **kwargs: None
        try:
            return engine(shape, "pdl", max_batch, context)
        finally:
            llama.LlamaForCausalLM.forward_sample = fused
    if name in PATCHED:  # graphs are captured at start-up: launches made while patched keep the patch
        modules = PATCHED[name]
        saved = [m.pdl_kwargs for m in modules]
        for m in modules:
            m.pdl_kwargs = patched_kwargs(name)
        try:
            return engine(shape, "pdl", max_batch, context)
        finally:
            for m, kwargs in zip(modules, saved, strict=True):
                m.pdl_kwargs = kwargs
    return LLM(
        shape,
        load_format="dummy",
        dtype="bfloat16",
        block_size=16,
        num_kv_blocks=blocks,
        max_num_seqs=max_batch,
        max_num_batched_tokens=2048,
        max_model_len=context + 16,
        mixed_graph_max_tokens=0,
        enable_prefix_caching=False,
        pdl_decode=name == "pdl",
    )


def replay_us(graph: torch.cuda.CUDAGraph, n: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def host_us(fn, n: int) -> float:
    """Host wall time per call of `fn`, launched back to back without waiting for the device."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6 / n


def cpu_work_ms(graph: torch.cuda.CUDAGraph | None, vocab: int) -> float:
    """Wall ms of a fixed piece of host work (building 300 decode steps' inputs in numpy) while `graph` is
    replayed 100 times on the device (None: an idle device): does a running graph slow the host down?"""
    rng = np.random.default_rng(0)
    torch.cuda.synchronize()
    if graph is not None:
        for _ in range(100):
            graph.replay()
    t0 = time.perf_counter()
    for _ in range(300):
        decode_step(64, 1024, 16, vocab, rng)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e3


def run_us(fn, n: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def print_host_times(graphs: dict, batch: int, step, vocab: int) -> None:
    for name, g in graphs.items():
        replay = statistics.median(host_us(g.graphs[batch][0].replay, 20) for _ in range(5))
        run = statistics.median(host_us(lambda g=g, step=step: g.run(step, None), 20) for _ in range(5))
        print(f"      host us a call, {name}: graph.replay {replay:.1f}, DecodeGraphs.run {run:.1f}")
    for name, g in graphs.items():
        idle = statistics.median(cpu_work_ms(None, vocab) for _ in range(5))
        busy = statistics.median(cpu_work_ms(g.graphs[batch][0], vocab) for _ in range(5))
        print(f"      host work ms, {name}: device idle {idle:.2f}, device replaying {busy:.2f}")


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-shape", default="qwen2.5-0.5b")
    p.add_argument("--batches", default="16,64")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--kernels", action="store_true")
    p.add_argument("--timeline", action="store_true")
    p.add_argument("--no-host", action="store_true", help="skip the host-side timings")
    p.add_argument(
        "--engines",
        default="pdl,plain",
        help=f"of {', '.join(sorted(ENGINES))}, each with +spread or +NxK[@BM]=bn/bk/split/stages (repeatable)",
    )
    p.add_argument("--chain-rows", type=int, help="chain decode steps of up to this many rows")
    p.add_argument("--chain-attention-rows", type=int, default=0, help="with --chain-rows: attention's rows")
    p.add_argument("--programs-per-sm", type=int, help="decode attention's split target")
    args = p.parse_args()
    if args.programs_per_sm is not None:
        paged_decode_split.PROGRAMS_PER_SM = args.programs_per_sm
    if args.chain_rows is not None:
        chain = llama.DecodeChain(args.chain_rows, args.chain_attention_rows)
        llama.decode_chain = lambda hidden_size: chain
    batches = [int(b) for b in args.batches.split(",")]
    names = args.engines.split(",")
    if not {n.split("+")[0] for n in names} <= ENGINES:
        p.error(f"--engines takes {', '.join(sorted(ENGINES))}, got {args.engines!r}")
    engines = {}
    for name in names:
        engines[name] = engine(args.model_shape, name, max(batches), args.context)
        print(f"{name}: pdl_decode={engines[name].engine.core.runner.model.pdl_decode}")
    vocab = next(iter(engines.values())).engine.core.runner.cfg.vocab_size
    print(f"{args.model_shape}, ctx {args.context}, us a step, median of {args.rounds} alternating rounds")
    print(f"{'batch':>5} {'engine':>6} {'replay':>9} {'run':>9}   rounds (replay)")
    for batch in batches:
        step = decode_step(batch, args.context, 16, vocab, np.random.default_rng(batch))
        graphs = {name: llm.engine.core.runner.graphs for name, llm in engines.items()}
        for g in graphs.values():
            assert g is not None and g.can_run(step)
            g.run(step, None)
        logits = {}
        for name, g in graphs.items():
            graph, out = g.graphs[batch]
            graph.replay()
            logits[name] = out[:batch].float().clone()
        first = next(iter(logits.values()))
        diff = max((x - first).abs().max().item() for x in logits.values())
        times: dict[str, dict[str, list[float]]] = {n: {"replay": [], "run": []} for n in graphs}
        for _ in range(args.rounds):
            for name, g in graphs.items():
                times[name]["replay"].append(replay_us(g.graphs[batch][0], args.iters))
                times[name]["run"].append(run_us(lambda g=g, step=step: g.run(step, None), args.iters // 4))
        for name in graphs:
            r = times[name]
            print(
                f"{batch:5d} {name:>6} {statistics.median(r['replay']):9.1f} {statistics.median(r['run']):9.1f}   "
                + " ".join(f"{x:.0f}" for x in r["replay"])
            )
        print(f"      logits max difference between the engines {diff:.3g}")
        if not args.no_host:
            print_host_times(graphs, batch, step, vocab)
        if args.kernels:
            from probe_step_kernels import kernel_table, print_table

            for name, g in graphs.items():
                graph = g.graphs[batch][0]
                rows, total = kernel_table(graph.replay, 20)
                print_table(f"{name} b={batch}", rows, total, 16)
        if args.timeline:
            from probe_step_kernels import kernel_timeline, print_timeline

            for name, g in graphs.items():
                print_timeline(f"{name} b={batch}", *kernel_timeline(g.graphs[batch][0].replay, 10))


if __name__ == "__main__":
    main()
