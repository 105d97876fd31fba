"""One graphed decode step under Nsight Compute: hardware counters for its kernels (GPU only).

Builds the engine on a dummy model, replays the decode graph for batch B at context C a few times to warm
up, then replays it once between cudaProfilerStart/Stop, so that

    ncu --profile-from-start off --launch-count 20 --section ... python scripts/ncu_decode_step.py

profiles only that step's first kernels (the embedding, then layer 0's, then layer 1's).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from ab_pdl_decode import engine

from roseinfer.bench.roofline import decode_step


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-shape", default="qwen2.5-0.5b")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--no-pdl-decode", action="store_true")
    args = p.parse_args()
    # ab_pdl_decode's engine holds just the step's blocks: ncu saves and restores device memory around every
    # pass of every kernel.
    llm = engine(args.model_shape, not args.no_pdl_decode, args.batch, args.context)
    runner = llm.engine.core.runner
    bs = llm.engine.core.config.cache.block_size
    step = decode_step(args.batch, args.context, bs, runner.cfg.vocab_size, np.random.default_rng(0))
    for _ in range(5):
        runner.graphs.run(step, None)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    runner.graphs.run(step, None)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"# profiled one decode step: {args.model_shape} b={args.batch} ctx={args.context}")


if __name__ == "__main__":
    main()
