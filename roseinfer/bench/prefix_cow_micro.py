"""`bench prefix` cow-micro: copying K blocks of the engine's KV cache in one batched call vs one call per
pair (us per copy, per copy path), and a check that both leave the same cache."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from roseinfer.bench.device import sync
from roseinfer.bench.prefix_common import PrefixBench, format_table
from roseinfer.bench.workloads import build_workload
from roseinfer.engine.llm_engine import LLMEngine

COW_BLOCKS = 16


def time_per_call(fn: Callable[[], None], device: torch.device, iters: int, warmup: int = 3) -> float:
    """Seconds per call of `fn`: CUDA events around `iters` calls on a GPU, perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def cow_pairs(num_blocks: int, k: int) -> list[tuple[int, int]]:
    """k (src, dst) pairs over distinct blocks: sources 0..k-1, destinations k..2k-1."""
    if 2 * k > num_blocks:
        raise ValueError(f"{k} copies need {2 * k} distinct blocks; the cache has {num_blocks}")
    return [(i, k + i) for i in range(k)]


CopyFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]  # (kv_cache, src, dst)


def copy_variants(engine: LLMEngine) -> dict[str, CopyFn]:
    """The batched block copies to measure: the engine's backend, and on a GPU the Triton kernel too."""
    runner = engine.core.runner
    variants: dict[str, CopyFn] = {f"{runner.backend.name} backend.copy_blocks": runner.backend.copy_blocks}
    if runner.device.type == "cuda":
        try:
            from roseinfer.kernels.block_copy import copy_blocks as triton_copy_blocks
        except ImportError:
            pass
        else:
            variants["triton kernels.block_copy"] = triton_copy_blocks
    return variants


@torch.inference_mode()
def check_batched_equals_looped(copy_fn: CopyFn, like: torch.Tensor, pairs: list[tuple[int, int]]) -> bool:
    """Copies `pairs` with one batched `copy_fn` call into one random cache shaped like `like` (the blocks
    the pairs touch, plus one untouched), and one call per pair into a clone of it: True if both end up
    identical, each destination holds its source's old block, and every other block is unchanged."""
    num = min(like.shape[0], max(max(p) for p in pairs) + 2)
    gen = torch.Generator(device=like.device).manual_seed(0)
    shape = (num, *like.shape[1:])
    original = torch.randn(shape, generator=gen, device=like.device, dtype=torch.float32).to(like.dtype)
    batched, looped = original.clone(), original.clone()
    src = torch.tensor([p[0] for p in pairs], dtype=torch.int64, device=like.device)
    dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64, device=like.device)
    copy_fn(batched, src, dst)
    for i in range(len(pairs)):
        copy_fn(looped, src[i : i + 1], dst[i : i + 1])
    expected = original.clone()
    expected[dst] = original[src]
    sync(like.device)
    return bool(torch.equal(batched, looped) and torch.equal(batched, expected))


@torch.inference_mode()
def measure_cow(engine: LLMEngine, k: int, iters: int) -> dict[str, Any]:
    """us per copied block, batched vs looped, for each copy variant with the index tensors already on the
    device, and for the engine's own path (`ModelRunner.copy_blocks(pairs)`, which builds and uploads
    the index tensors on every call)."""
    runner = engine.core.runner
    kv = runner.kv_cache
    assert kv is not None
    device = kv.device
    pairs = cow_pairs(kv.shape[0], k)
    src = torch.tensor([p[0] for p in pairs], dtype=torch.int64, device=device)
    dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64, device=device)
    singles = [(src[i : i + 1], dst[i : i + 1]) for i in range(k)]

    cases: list[tuple[str, Callable[[], None], Callable[[], None]]] = []
    for name, fn in copy_variants(engine).items():

        def batched(fn: CopyFn = fn) -> None:
            fn(kv, src, dst)

        def looped(fn: CopyFn = fn) -> None:
            for s, d in singles:
                fn(kv, s, d)

        cases.append((f"{name} (indices on device)", batched, looped))

    def runner_batched() -> None:
        runner.copy_blocks(pairs)

    def runner_looped() -> None:
        for p in pairs:
            runner.copy_blocks([p])

    cases.append(("runner.copy_blocks (indices uploaded)", runner_batched, runner_looped))
    rows = []
    for path, batched_fn, looped_fn in cases:
        b = time_per_call(batched_fn, device, iters) / k * 1e6
        lo = time_per_call(looped_fn, device, iters) / k * 1e6
        rows.append(
            {"path": path, "batched_us": b, "looped_us": lo, "speedup": lo / b if b > 0 else float("nan")}
        )
    block_bytes = kv[0].numel() * kv.element_size()
    return {"rows": rows, "block_bytes": block_bytes, "pairs": len(pairs), "iters": iters}


def bench_cow_micro(bench: PrefixBench) -> dict[str, Any]:
    a = bench.args
    k = a.cow_blocks
    # The W5 engine settings (block size 64), with a small pool: the copies need 2k distinct blocks.
    spec = build_workload("W5", bench.model_config.vocab_size, num_requests=1, max_output_len=1)
    engine = bench.make_engine(spec, True, defaults={"num_kv_blocks": max(2 * k + 1, 8)})
    try:
        pairs = cow_pairs(engine.core.num_blocks, k)
        kv = engine.core.runner.kv_cache
        assert kv is not None
        checks = {
            name: check_batched_equals_looped(fn, kv, pairs) for name, fn in copy_variants(engine).items()
        }
        del kv
        result = measure_cow(engine, k, a.cow_iters)
        block_size = engine.config.cache.block_size
        backend = engine.core.runner.backend.name
    finally:
        del engine
        bench.free()
    title = (
        f"cow-micro: {k} block copies ({result['block_bytes'] / 1024:.1f} KiB each, block size {block_size}, "
        f"{backend} backend), {a.cow_iters} iterations"
    )
    text = format_table(
        title,
        [
            ("path", "path", "s"),
            ("batched_us", "batched us/copy", ".2f"),
            ("looped_us", "looped us/copy", ".2f"),
            ("speedup", "looped/batched", ".2f"),
        ],
        result["rows"],
    )
    identical = all(checks.values())
    text += "\n" + "\n".join(
        f"cow-micro: {name}: batched copy leaves the cache identical to the looped copy: {ok}"
        for name, ok in checks.items()
    )
    return {
        "rows": result["rows"],
        "identical": identical,
        "identical_by_variant": checks,
        "num_copies": k,
        "block_bytes": result["block_bytes"],
        "block_size": block_size,
        "backend": backend,
        "iters": a.cow_iters,
        "text": text,
    }
