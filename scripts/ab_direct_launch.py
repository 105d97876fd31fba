"""Eager steps with the kernels launched through `DirectLaunch.run` against through Triton's per-call binding
(or, with `--against triton-math`, the host code's `cdiv` / `next_power_of_2` against Triton's),
alternating in one engine.

Runs a workload on an engine whose steps all run eagerly (`enforce_eager`, or with `--mixed-only` only the
steps with prefill work), skips `--skip` steps, then alternates step by step, `--steps` each: the tree as it
is, then the other mode: every launch through `kernel[grid](...)` (`--against triton-binding`), or every
kernel module's host `cdiv` and `next_power_of_2` replaced by Triton's constexpr functions (`--against triton-
math`). Alternating each step gives both modes the same phases of the workload (its batch shrinks as requests
finish).

Prints each mode's host launch time (the runner's `launch`) and wall time a step: mean, median and each fifth
of the run's steps. Then the Triton compiles that fell in its steps (their steps are left out of the figures:
a deterministic workload meets a new variant on the same step every run) and its full collections. With
`--cprofile N`, then where N more steps' host time goes. GPU only.

    python scripts/ab_direct_launch.py --model-shape qwen3-0.6b [--workload W2] [--steps 100] [--against triton-math]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pkgutil
import pstats
import statistics
import time
from collections.abc import Callable
from importlib import import_module
from pathlib import Path

import torch
import triton
from probe_mixed_step import LaunchTimer  # scripts/ is on the path when a script runs

from roseinfer.bench.jit_watch import watch_triton_compiles
from roseinfer.bench.workloads import build_workload
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.llm import make_engine_config
from roseinfer.kernels import _common
from roseinfer.kernels.direct_launch import DirectLaunch

CONFIGS = Path(__file__).resolve().parents[1] / "roseinfer/models/configs"


def through_triton(self: DirectLaunch, grid, args, constexprs) -> None:
    self.kernel[tuple(grid)](*args, **constexprs)


DIRECT_RUN = DirectLaunch.run


def triton_binding(on: bool) -> None:
    DirectLaunch.run = through_triton if on else DIRECT_RUN  # type: ignore[method-assign]


def host_math_modules() -> list[object]:
    """The kernel modules whose host code calls `_common`'s `cdiv` or `next_power_of_2`."""
    import roseinfer.kernels as kernels

    modules = [import_module(f"roseinfer.kernels.{m.name}") for m in pkgutil.iter_modules(kernels.__path__)]
    ours = {id(_common.cdiv), id(_common.next_power_of_2)}
    return [m for m in modules if m is not _common and ours & {id(v) for v in vars(m).values()}]


def triton_math(on: bool, modules: list[object]) -> None:
    for module in modules:
        for name in ("cdiv", "next_power_of_2"):
            if getattr(module, name, None) in (getattr(triton, name), getattr(_common, name)):
                setattr(module, name, getattr(triton if on else _common, name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-shape", default="qwen3-0.6b")
    parser.add_argument("--workload", default="W2")
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--mixed-only", action="store_true", help="decode-only steps keep their graphs")
    parser.add_argument("--skip", type=int, default=100)
    parser.add_argument("--steps", type=int, default=100, help="steps in each mode")
    parser.add_argument(
        "--cprofile", type=int, default=0, help="then N steps as is under cProfile (top by tottime)"
    )
    parser.add_argument("--against", choices=("triton-binding", "triton-math"), default="triton-binding")
    args = parser.parse_args()
    if args.against == "triton-binding":
        other: Callable[[bool], None] = triton_binding
    else:
        modules = host_math_modules()
        print(f"Triton's cdiv / next_power_of_2 swapped into {len(modules)} modules")

        def other(on: bool) -> None:
            triton_math(on, modules)

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
    results: dict[str, list[tuple[float, float]]] = {"as is": [], args.against: []}
    # What lands in one mode's steps, not the other's: Triton compiles (or disk-cache loads), full collections.
    compiles: dict[str, list] = {mode: [[], 0.0] for mode in results}  # variants, seconds
    full_collections = dict.fromkeys(results, 0)
    mode = "as is"

    def count_full_collections(phase: str, info: dict) -> None:
        full_collections[mode] += phase == "start" and info["generation"] == 2

    gc.callbacks.append(count_full_collections)
    for _ in range(args.steps):
        if not engine.has_unfinished_requests():  # an idle engine's steps would time nothing
            print(f"the workload finished after {len(results['as is'])} steps a mode: --skip fewer steps")
            break
        for mode in results:
            other(mode != "as is")
            torch.cuda.synchronize()
            timer.seconds = 0.0
            t0 = time.perf_counter()
            with watch_triton_compiles() as compiled:
                engine.step(final_only=True)
                torch.cuda.synchronize()
            if not compiled:  # a step that compiled (or loaded) a variant times Triton's compiler: left out
                results[mode].append((time.perf_counter() - t0, timer.seconds))
            compiles[mode][0] += compiled.variants
            compiles[mode][1] += compiled.total_seconds()
    gc.callbacks.remove(count_full_collections)
    other(False)
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
                f"  {mode:14s} {label}: mean {statistics.mean(times):6.2f}, median {statistics.median(times):6.2f}"
                f"  | by fifths {fifths}"
            )
        print(
            f"  {mode:14s} Triton compiles {len(compiles[mode][0])} ({compiles[mode][1]:.2f} s; their steps left out),"
            f" full collections {full_collections[mode]}"
        )
        for variant in compiles[mode][0]:
            print(f"    {variant}")
    if args.cprofile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.cprofile):
            engine.step(final_only=True)
        torch.cuda.synchronize()
        profiler.disable()
        print(f"cProfile of {args.cprofile} steps as is, by own time:")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(40)


if __name__ == "__main__":
    main()
