"""Eager steps with the layer kernels launched through `DirectLaunch.run` against through Triton's per-call binding,
alternating in one engine.

Runs a workload on an engine whose steps all run eagerly (`enforce_eager`, or with `--mixed-only` only the steps
with prefill work), skips `--skip` steps, then alternates step by step, `--steps` each: `DirectLaunch.run` as it is,
then every launch through `kernel[grid](...)`. Alternating each step gives both modes the same phases of the
workload (its batch shrinks as requests finish). Prints each mode's host launch time (the runner's `launch`) and
wall time a step: mean, median and each fifth of the run's steps. GPU only.

    python scripts/ab_direct_launch.py --model-shape qwen3-0.6b [--workload W2] [--steps 100]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from probe_mixed_step import LaunchTimer  # scripts/ is on the path when a script runs

from roseinfer.bench.workloads import build_workload
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.llm import make_engine_config
from roseinfer.kernels.direct_launch import DirectLaunch

CONFIGS = Path(__file__).resolve().parents[1] / "roseinfer/models/configs"


def through_triton(self: DirectLaunch, grid, args, constexprs) -> None:
    self.kernel[tuple(grid)](*args, **constexprs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-shape", default="qwen3-0.6b")
    parser.add_argument("--workload", default="W2")
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--mixed-only", action="store_true", help="decode-only steps keep their graphs")
    parser.add_argument("--skip", type=int, default=100)
    parser.add_argument("--steps", type=int, default=100, help="steps in each mode")
    args = parser.parse_args()
    config, path = make_engine_config(
        str(CONFIGS / f"{args.model_shape}.json"),
        load_format="dummy",
        dtype="bfloat16",
        device="cuda",
        max_num_batched_tokens=args.max_num_batched_tokens,
        enforce_eager=not args.mixed_only,
        mixed_graph_max_tokens=0,
    )
    engine = LLMEngine(config, path)
    workload = build_workload(args.workload, engine.model_config.vocab_size)
    for prompt, params in zip(workload.prompts, workload.params, strict=True):
        engine.add_request(prompt, params)
    for _ in range(args.skip):
        engine.step(final_only=True)
    timer = LaunchTimer(engine.core.runner)
    direct_run = DirectLaunch.run
    results: dict[str, list[tuple[float, float]]] = {"direct": [], "via Triton": []}
    for _ in range(args.steps):
        for mode, run in (("direct", direct_run), ("via Triton", through_triton)):
            DirectLaunch.run = run  # type: ignore[method-assign]
            torch.cuda.synchronize()
            timer.seconds = 0.0
            t0 = time.perf_counter()
            engine.step(final_only=True)
            torch.cuda.synchronize()
            results[mode].append((time.perf_counter() - t0, timer.seconds))
    DirectLaunch.run = direct_run  # type: ignore[method-assign]
    kind = "steps with prefill work" if args.mixed_only else "every step"
    print(
        f"{args.model_shape} {args.workload}, budget {args.max_num_batched_tokens}, eager: {kind}; ms a step"
    )
    for mode, steps in results.items():
        for i, label in ((1, "host"), (0, "wall")):
            times = [s[i] * 1e3 for s in steps]
            fifths = " ".join(
                f"{statistics.mean(times[j * len(times) // 5 : (j + 1) * len(times) // 5]):6.2f}"
                for j in range(5)
            )
            print(
                f"  {mode:10s} {label}: mean {statistics.mean(times):6.2f}, median {statistics.median(times):6.2f}"
                f"  | by fifths {fifths}"
            )


if __name__ == "__main__":
    main()
