"""Host cost of each piece of a graphed decode step's launch on the GPU (qwen2.5-0.5b, batch 64).

Every piece is timed alone with perf_counter, the device synchronised after each call, so that the
figure is the host's launch work, not queueing behind the GPU. Beside `DecodeGraphs.run` as it is (one
packed input copy, the pending fill and sampling inside the replay) it times the pieces that path
replaced at 484be01: a staged upload, a copy per input, the index fill and the sampler's launches.
Run on a CUDA machine:

    python scripts/probe_host_launch.py [--batch 64] [--width 40] [--iters 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from roseinfer.bench.workloads import build_workload
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.llm import make_engine_config
from roseinfer.kernels.sampling import sample_tokens
from roseinfer.runner.inputs import HostStep, fill_pending

CONFIG = Path(__file__).resolve().parents[1] / "roseinfer/models/configs/qwen2.5-0.5b.json"


def host_us(fn: Callable[[], object], iters: int) -> float:
    """Median host microseconds of one call, the device idle before each."""
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=40, help="block-table width (blocks per sequence)")
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    config, path = make_engine_config(str(CONFIG), load_format="dummy", dtype="bfloat16", device="cuda")
    engine = LLMEngine(config, path)
    runner = engine.core.runner
    graphs, staging = runner.graphs, runner.stagings[0]
    assert graphs is not None
    b, w, i32 = args.batch, args.width, np.int32
    step = HostStep(
        input_ids=np.arange(b, dtype=i32) + 1000,
        positions=np.full(b, 600, i32),
        slot_mapping=np.arange(b, dtype=i32) * w * 16 + 600,
        query_start_loc=np.arange(b + 1, dtype=i32),
        seq_lens=np.full(b, 601, i32),
        block_tables=np.arange(b * w, dtype=i32).reshape(b, w),
        max_query_len=1,
        fill_index=np.arange(b, dtype=i32),
        fill_row=np.arange(b, dtype=i32),
        logits_index=np.arange(b, dtype=i32),
    )
    prev = torch.zeros(b, dtype=torch.int32, device="cuda")
    arrays = [step.input_ids, step.positions, step.slot_mapping, step.seq_lens, step.block_tables]
    arrays += [step.fill_index, step.fill_row, step.logits_index]
    views = staging.upload(arrays)
    ids, pos, slots, seq_lens, tables, fill_index, fill_row, _ = views
    graph, logits = graphs.graphs[b]
    logits = logits[:b]

    def copies() -> None:
        graphs.ids[:b].copy_(ids)
        graphs.positions[:b].copy_(pos)
        graphs.slots[:b].copy_(slots)
        graphs.seq_lens[:b].copy_(seq_lens)
        graphs.block_tables[:b, :w].copy_(tables)

    def d2h() -> None:
        tokens = torch.zeros(b, dtype=torch.int32, device="cuda")
        host = torch.empty(tokens.shape, dtype=torch.int32, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        torch.cuda.Event().record()

    rows = [
        ("staging.upload (8 arrays, one H2D copy)", lambda: staging.upload(arrays)),
        ("5 copies into the graph's buffers", copies),
        ("fill_pending (index gather + put)", lambda: fill_pending(graphs.ids, fill_index, fill_row, prev)),
        ("graph.replay()", graph.replay),
        (
            "DecodeGraphs.run (packed inputs, fill + sampling in the graph)",
            lambda: graphs.run(step, graphs.tokens[:b]),
        ),
        ("sample_tokens greedy + .to(int32)", lambda: sample_tokens(logits, None, None).to(torch.int32)),
        ("zeros + pinned empty + D2H copy + event", d2h),
        ("one torch.zeros on the device (a bare op)", lambda: torch.zeros(b, device="cuda")),
    ]
    w1 = build_workload("W1", engine.model_config.vocab_size)

    def validate_w1() -> None:
        for prompt, params in zip(w1.prompts, w1.params):
            engine.validate(prompt, params)

    rows.append(("validate W1's 64 prompts of 512 tokens", validate_w1))
    print(
        f"qwen2.5-0.5b decode launch, batch {b}, table width {w}: host us per call (median of {args.iters})"
    )
    for name, fn in rows:
        print(f"{name:62s} {host_us(fn, args.iters):8.1f}")


if __name__ == "__main__":
    main()
