"""Where the GPU time of one W1-shaped prefill step and one graphed decode step goes, kernel by kernel.

W1's prefill is steps of 32 prompts x 512 tokens (the default 16k-token budget); its decode is batch 64
at contexts 513-640. Each step runs `--iters` times under the torch profiler (CUDA activity only); the
table is device us per step by kernel name, its share of the step's kernel time, and the step's time
against its floor (matmul FLOPs / measured rate for prefill, bytes / measured bandwidth for decode).

    python scripts/probe_step_kernels.py --model-shape llama-3.1-8b
"""

from __future__ import annotations

import argparse
import collections
import statistics

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from roseinfer.bench.env import measure_copy_bandwidth, measure_matmul_tflops
from roseinfer.bench.roofline import decode_step, prefill_flops, weight_bytes_per_decode
from roseinfer.entrypoints.llm import LLM
from roseinfer.models.layers import ForwardContext
from roseinfer.runner.inputs import HostStep, upload_step


def w1_prefill_step(
    seqs: int, tokens: int, block_size: int, vocab: int, rng: np.random.Generator
) -> HostStep:
    per_seq = -(-tokens // block_size)
    tables = np.arange(seqs * per_seq, dtype=np.int32).reshape(seqs, per_seq)
    pos = np.tile(np.arange(tokens, dtype=np.int32), seqs)
    seq = np.repeat(np.arange(seqs), tokens)
    slots = tables[seq, pos // block_size] * block_size + pos % block_size
    cu = np.arange(seqs + 1, dtype=np.int32) * tokens
    return HostStep(
        input_ids=rng.integers(1000, min(vocab, 32000), seqs * tokens).astype(np.int32),
        positions=pos,
        slot_mapping=slots.astype(np.int32),
        query_start_loc=cu,
        seq_lens=np.full(seqs, tokens, np.int32),
        block_tables=tables,
        max_query_len=tokens,
        logits_index=(cu[1:] - 1).astype(np.int32),
    )


def cuda_events(fn, iters: int) -> list:
    """The device events of `iters` runs of `fn` (after 3 warm-up runs), under the torch profiler."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return [ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]


def kernel_table(fn, iters: int) -> tuple[list[tuple[str, int, float]], float]:
    """([(kernel, launches per step, us per step)], kernel us per step) over `iters` runs of `fn`."""
    totals: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.Counter()
    for ev in cuda_events(fn, iters):
        totals[ev.name] += ev.device_time
        counts[ev.name] += 1
    rows = sorted(((n, counts[n] // iters, t / iters) for n, t in totals.items()), key=lambda r: -r[2])
    return rows, sum(totals.values()) / iters


def kernel_timeline(
    fn, iters: int, cycle_start: str = "_decode_kernel"
) -> tuple[list[tuple[str, float, float, float]], float]:
    """Each kernel of a step in stream order, labelled by name and its place after the last `cycle_start`
    kernel (a decode layer starts over at its attention): [(label, us it adds to the step, us from its
    first program to its last, us it started before its predecessor ended)], medians over the layers and
    `iters` runs of `fn`; and a run's us from its first kernel's start to its last's end (median). Under PDL a
    kernel starts early, so only the first column adds up to the step."""
    events = sorted(cuda_events(fn, iters), key=lambda ev: ev.time_range.start)
    per_run = len(events) // iters
    run_us = [
        events[i + per_run - 1].time_range.end - events[i].time_range.start
        for i in range(0, per_run * iters, per_run)
    ]
    adds: dict[str, list[float]] = collections.defaultdict(list)
    spans: dict[str, list[float]] = collections.defaultdict(list)
    early: dict[str, list[float]] = collections.defaultdict(list)
    place, prev_end = 0, None
    for ev in events:
        place = 0 if ev.name.startswith(cycle_start) else place + 1
        label = f"{place:2d} {ev.name[:60]}"
        start, end = ev.time_range.start, ev.time_range.end
        spans[label].append(end - start)
        if prev_end is not None and start - prev_end < 50:  # not after an idle gap
            adds[label].append(end - prev_end)
            early[label].append(prev_end - start)
        prev_end = end if prev_end is None else max(prev_end, end)
    med = statistics.median
    rows = [
        (
            label,
            med(adds[label]) if adds[label] else 0.0,
            med(spans[label]),
            med(early[label]) if early[label] else 0.0,
        )
        for label in sorted(spans, key=lambda k: (int(k[:2]), k))
    ]
    return rows, med(run_us)


def print_table(title: str, rows: list[tuple[str, int, float]], total_us: float, top: int) -> None:
    print(f"\n## {title}: {total_us:.0f} us of kernels per step")
    print(f"{'us/step':>9} {'share':>6} {'n':>5}  kernel")
    for name, n, us in rows[:top]:
        print(f"{us:9.1f} {100 * us / total_us:5.1f}% {n:5d}  {name[:110]}")


def print_timeline(title: str, rows: list[tuple[str, float, float, float]], run_us: float) -> None:
    print(f"\n## {title}: {run_us:.0f} us from a step's first kernel start to its last kernel end")
    print(f"{'adds us':>8} {'span us':>8} {'early us':>8}  place, kernel")
    for label, adds, span, early in rows:
        print(f"{adds:8.2f} {span:8.2f} {early:8.2f}  {label}")


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-shape", default="llama-3.1-8b")
    p.add_argument("--prefill-seqs", type=int, default=32)
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=576)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--no-prefill", action="store_true")
    p.add_argument(
        "--programs-per-sm", type=int, default=None, help="override decode attention's split target"
    )
    args = p.parse_args()
    if args.programs_per_sm is not None:
        import roseinfer.kernels.paged_decode_split as split

        split.PROGRAMS_PER_SM = args.programs_per_sm
    dev = torch.device("cuda")
    bandwidth, tflops = measure_copy_bandwidth(dev), measure_matmul_tflops(dev)
    print(f"# copy {bandwidth / 1e12:.2f} TB/s, bf16 matmul {tflops:.0f} TFLOP/s")
    n_prefill = args.prefill_seqs * args.prefill_tokens
    llm = LLM(
        args.model_shape,
        load_format="dummy",
        max_num_seqs=max(args.batch, args.prefill_seqs),
        max_num_batched_tokens=n_prefill,
        max_model_len=max(args.prefill_tokens, args.context) + 16,
        enable_prefix_caching=False,
    )
    runner = llm.engine.core.runner
    cfg, bs = runner.cfg, llm.engine.core.config.cache.block_size
    rng = np.random.default_rng(0)

    step = w1_prefill_step(args.prefill_seqs, args.prefill_tokens, bs, cfg.vocab_size, rng)

    def prefill() -> None:
        ids, pos, meta, rows = upload_step(step, runner.staging)
        hidden = runner.model(ids, pos, ForwardContext(runner.kv_cache, meta, runner.backend))
        runner.model.compute_logits(hidden[rows.long()])

    if not args.no_prefill:
        prefill_table(args, prefill, cfg, tflops)
    decode_table(args, runner, cfg, bs, bandwidth, rng)


def prefill_table(args, prefill, cfg, tflops: float) -> None:
    rows, total = kernel_table(prefill, args.iters)
    # Causal attention of each 512-token prompt on top of the linears' FLOPs.
    flops = prefill_flops(cfg, args.prefill_tokens) * args.prefill_seqs
    floor_us = flops / (tflops * 1e12) * 1e6
    print_table(
        f"{args.model_shape} prefill {args.prefill_seqs} x {args.prefill_tokens} "
        f"(floor {floor_us:.0f} us, {total / floor_us:.2f}x; {100 * floor_us / total:.0f}% of the matmul rate)",
        rows,
        total,
        args.top,
    )


def decode_table(args, runner, cfg, bs: int, bandwidth: float, rng: np.random.Generator) -> None:
    dstep = decode_step(args.batch, args.context, bs, cfg.vocab_size, rng)
    graphs = runner.graphs
    rows, total = kernel_table(lambda: graphs.run(dstep, None), args.iters * 4)
    elem = torch.empty((), dtype=runner.dtype).element_size()
    floor_bytes = weight_bytes_per_decode(cfg, elem) + args.batch * args.context * cfg.kv_bytes_per_token(
        runner.dtype
    )
    floor_us = floor_bytes / bandwidth * 1e6
    print_table(
        f"{args.model_shape} graphed decode b={args.batch} ctx={args.context} "
        f"(floor {floor_us:.0f} us, {total / floor_us:.2f}x)",
        rows,
        total,
        args.top,
    )


if __name__ == "__main__":
    main()
