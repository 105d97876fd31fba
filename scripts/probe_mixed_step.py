"""Is a mixed step (decodes + a prefill chunk, run eagerly unless `--mixed-graph-max-tokens` > 0) bound
by the host or by the GPU?

Runs a workload on the real engine for `--skip` steps (printing their wall time 100 steps at a time),
then times `--steps` more: wall time per step and the host's time in `launch`, then the kernel time per
step from a CUDA-only profiler trace of `--steps` further steps (kernel durations do not depend on how
fast the host launches them). Also prints the CUDA allocator's retries and device frees (each cudaFree
syncs the device). `--no-gc` turns Python's cyclic garbage collector off for the timed steps;
`--warmup` first runs the warm-up `bench throughput` runs.

    python scripts/probe_mixed_step.py --model-shape llama-3.1-8b --admission-policy lof \
        --max-num-batched-tokens 320 --skip 300 --steps 20
"""

from __future__ import annotations

import argparse
import collections
import gc
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from roseinfer.bench.workloads import build_workload
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.llm import make_engine_config

CONFIGS = Path(__file__).resolve().parents[1] / "roseinfer/models/configs"


class LaunchTimer:
    """Adds up the host's time in `runner.launch` (in `seconds`), wrapping it in place."""

    def __init__(self, runner) -> None:
        self.seconds = 0.0
        original = runner.launch

        def timed(out):
            t0 = time.perf_counter()
            try:
                return original(out)
            finally:
                self.seconds += time.perf_counter() - t0

        runner.launch = timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-shape", default="llama-3.1-8b")
    parser.add_argument("--workload", default="W2")
    parser.add_argument("--admission-policy", default="lof")
    parser.add_argument("--max-num-batched-tokens", type=int, default=320)
    parser.add_argument("--skip", type=int, default=300)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-gc", action="store_true")
    parser.add_argument(
        "--warmup", action="store_true", help="first run the bench's warm-up (4-token outputs)"
    )
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument(
        "--mixed-graph-max-tokens",
        type=int,
        default=0,
        help="replay mixed steps as CUDA graphs (default 0: eager)",
    )
    args = parser.parse_args()

    config, path = make_engine_config(
        str(CONFIGS / f"{args.model_shape}.json"),
        load_format="dummy",
        dtype="bfloat16",
        device="cuda",
        max_num_batched_tokens=args.max_num_batched_tokens,
        admission_policy=args.admission_policy,
        enable_prefix_caching=not args.no_prefix_caching,
        mixed_graph_max_tokens=args.mixed_graph_max_tokens,
    )
    engine = LLMEngine(config, path)
    workload = build_workload(args.workload, engine.model_config.vocab_size)
    if args.warmup:  # as `bench throughput`: every request, other token ids, 4 output tokens
        warm = build_workload(args.workload, engine.model_config.vocab_size, max_output_len=4, seed=1)
        for prompt, params in zip(warm.prompts, warm.params):
            engine.add_request(prompt, params)
        while engine.has_unfinished_requests():
            engine.step(final_only=True)
    for prompt, params in zip(workload.prompts, workload.params):
        engine.add_request(prompt, params)

    def allocator(label: str) -> None:  # retries and device frees: each cudaFree syncs the device
        m = torch.cuda.memory_stats()
        keys = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")
        print(
            label, {k: m.get(k) for k in keys}, f"reserved {m['reserved_bytes.all.current'] / 2**30:.1f} GiB"
        )

    allocator("after warm-up:")
    walls = []
    for _ in range(args.skip):
        t0 = time.perf_counter()
        engine.step(final_only=True)
        walls.append(time.perf_counter() - t0)
    for start in range(0, len(walls), 100):  # the run so far, 100 steps at a time
        chunk = sorted(walls[start : start + 100])
        print(
            f"steps {start:4d}+: mean {sum(chunk) / len(chunk) * 1e3:7.2f} ms, "
            f"median {chunk[len(chunk) // 2] * 1e3:7.2f}, max {chunk[-1] * 1e3:8.2f}"
        )
    allocator(f"after {args.skip} steps:")
    timer = LaunchTimer(engine.core.runner)
    sched = engine.core.scheduler
    decodes = sum(1 for r in sched.running if r.num_computed_tokens >= r.num_prompt_tokens)
    if args.no_gc:
        gc.disable()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):  # untraced: the wall time and the host's launch time
        engine.step(final_only=True)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    host = timer.seconds
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # traced: the kernel time
        for _ in range(args.steps):
            engine.step(final_only=True)
        torch.cuda.synchronize()
    gc.enable()
    allocator(f"after {2 * args.steps} more:")
    kernels: collections.Counter[str] = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name[:60]] += e.device_time_total
    busy_ms = sum(kernels.values()) / 1e3 / args.steps
    n = args.steps
    print(
        f"{args.model_shape} {args.admission_policy} budget {args.max_num_batched_tokens}, ~{decodes} decodes, "
        f"warm-up {'yes' if args.warmup else 'no'}, prefix caching {'off' if args.no_prefix_caching else 'on'}"
    )
    print(
        f"wall {wall / n * 1e3:.2f} ms/step, launch (host) {host / n * 1e3:.2f} ms/step, "
        f"kernels {busy_ms:.2f} ms/step, gc {'off' if args.no_gc else 'on'}"
    )
    for name, us in kernels.most_common(12):
        print(f"  {us / 1e3 / n:8.3f} ms/step  {name}")


if __name__ == "__main__":
    main()
