"""Cache-miss TTFT on an idle engine: one prompt of N tokens, one greedy output token, with steps that hold
prefill work run eagerly (cap 0), replayed as graphs up to 512 tokens, or up to the model's automatic cap.

Prints, per cap: the engine's start-up time, the GPU memory left free after it (the graphs' pools come out
of it), then the median latency of `LLM.generate` per prompt length and the path its steps took. With
`--kernels N`, one more prompt of each length runs under the profiler (CUDA activity only): its kernel time
in all, and the N kernels that took longest.

    python scripts/probe_prefill_latency.py --model-shape qwen2.5-0.5b --lengths 128,512,1000,2000,4000
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from roseinfer import LLM, SamplingParams
from roseinfer.bench.env import bench_header, format_header


def build(shape: str, cap: int | None) -> tuple[LLM, float, float]:
    gc.collect()
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    llm = LLM(
        shape, load_format="dummy", dtype="bfloat16", enable_prefix_caching=False, mixed_graph_max_tokens=cap
    )
    torch.cuda.synchronize()
    return llm, time.perf_counter() - t0, torch.cuda.mem_get_info()[0] / 2**30


def time_prompts(llm: LLM, length: int, repeats: int, warmup: int, rng: np.random.Generator) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    vocab = llm.engine.model_config.vocab_size
    times = []
    for i in range(warmup + repeats):
        prompt = rng.integers(1000, min(vocab, 32000), size=length).tolist()  # WORKLOADS.md's token range
        t0 = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def print_kernels(llm: LLM, length: int, top: int, rng: np.random.Generator) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    prompt = rng.integers(1000, min(llm.engine.model_config.vocab_size, 32000), size=length).tolist()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate([prompt], params, use_tqdm=False)
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    total = sum(e.self_device_time_total for e in events)
    print(f"    kernels {total / 1e3:.2f} ms in all:")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
        print(f"    {e.self_device_time_total / 1e3:8.3f} ms  {e.count:4d}x  {e.key[:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-shape", default="qwen2.5-0.5b")
    parser.add_argument("--lengths", default="128,512,1000,2000,4000")
    parser.add_argument("--caps", default="0,512,auto", help="mixed_graph_max_tokens values; auto: unset")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--kernels", type=int, default=0, help="profile one more prompt: its N longest kernels"
    )
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    print(format_header(bench_header("cache-miss TTFT (one prompt, one token)", args.model_shape)))
    rows: dict[int, list[str]] = {n: [] for n in lengths}
    heads = []
    for name in args.caps.split(","):
        llm, start_s, free_gib = build(args.model_shape, None if name == "auto" else int(name))
        runner = llm.engine.core.runner
        heads.append(f"cap {runner.mixed_graph_max_tokens} ({name})")
        print(f"{heads[-1]}: start-up {start_s:.1f} s, {free_gib:.2f} GiB free after it")
        rng = np.random.default_rng(0)
        for n in lengths:
            before = dict(runner.step_paths)
            ms = time_prompts(llm, n, args.repeats, args.warmup, rng) * 1e3
            paths = {k: v - before[k] for k, v in runner.step_paths.items() if v > before[k]}
            rows[n].append(f"{ms:.2f}")
            print(f"  {n} tokens: {ms:.2f} ms median, steps {paths}")
            if args.kernels:
                print_kernels(llm, n, args.kernels, rng)
        del llm, runner
    print()
    print("| prompt tokens | " + " | ".join(f"{h} ms" for h in heads) + " |")
    print("|---:|" + "---:|" * len(heads))
    for n in lengths:
        print(f"| {n} | " + " | ".join(rows[n]) + " |")


if __name__ == "__main__":
    main()
