"""Paged prefill attention with and without key splits, on the chunks mixed steps and prefix-cache hits carry:
a short chunk over a long cached prefix, where one program a q tile walks every key while most SMs idle.

Times one launch's GPU time (a CUDA graph of an L2 flush and the launch, less the flush alone) per (shape,
case, split setting) and prints us; the first column is the plain grid the eager path used before splits.

    PYTHONPATH=$PWD python scripts/sweep_prefill_splits.py [--min-keys 128,256,512] [--programs-per-sm 1,2,4]
"""

from __future__ import annotations

import argparse
import functools

import torch
from sweep_prefill_tiles import HEADS
from sweep_prefill_tiles import build as build_inputs

from roseinfer.kernels._common import num_sms
from roseinfer.kernels.paged_prefill_attention import paged_prefill_attention
from roseinfer.kernels.prefill_plan import (
    SPLIT_PARTIAL_ROWS,
    KeySplit,
    key_split_for,
    prefill_block_m,
    prefill_tile_map,
)

# (chunk tokens, cached prefix tokens) per sequence of the step
CASES = {
    "1 x 100 over 900": [(100, 900)],
    "1 x 190 over 750": [(190, 750)],
    "2 x 96 over 1000": [(96, 1000), (96, 1000)],
    "1 x 320 over 1500": [(320, 1500)],
    "1 x 32 over 3000": [(32, 3000)],
    "1 x 640 fresh": [(640, 0)],
}


def build(case: list[tuple[int, int]], heads: tuple[int, int, int]):
    """The tile sweep's inputs, plus host copies of the sequence rows for the tile maps."""
    q, k, v, tables, qsl, sl, longest, _ = build_inputs(case, heads)
    return q, k, v, tables, qsl, sl, qsl.cpu().numpy(), sl.cpu().numpy(), longest


def bench(fn, reps: int = 50) -> float:
    """us of GPU time per launch: `fn` captured in a CUDA graph after an L2 flush, less the flush alone, so
    the wrapper's host time (longer than some of these launches) is not counted."""
    fn()  # compile, and allocate what the launch keeps (merge counters) outside the capture
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    graphs = []
    for with_fn in (False, True):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            flush.zero_()
            if with_fn:
                fn()
        graphs.append(graph)
    times = []
    for graph in graphs * 2:  # flush, both, flush, both: the second pair is kept
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return times[3] - times[2]


def time_map(inputs, case, heads, split: KeySplit | None, split_variant: bool = False) -> tuple[float, int]:
    """(us, programs a head) of the tile-map launch for `case`, cutting keys as `split` allows;
    `split_variant`: the kernel variant that can merge splits even when the map has none."""
    q, k, v, tables, qsl, sl, starts, seq_lens, longest = inputs
    block_m = prefill_block_m(heads[2], torch.bfloat16, longest)
    n_tiles = int(sum(-(-c // block_m) for c, _ in case))
    tiles = prefill_tile_map(starts, seq_lens, 0, block_m, n_tiles + 64, split)
    used = int((tiles[0] >= 0).sum())
    t = torch.from_numpy(tiles[:, :used].copy()).to(q.device)
    rows = SPLIT_PARTIAL_ROWS if split is not None or split_variant else 0
    fn = functools.partial(
        paged_prefill_attention, q, k, v, tables, qsl, sl, longest, heads[2] ** -0.5,
        block_m=block_m, tiles=t, split_rows=rows,
    )  # fmt: skip
    return bench(fn), used


def _arg_name(names: list[str], key: object) -> object:
    """A compiled variant's constant key: an argument's name, or (index,) of it."""
    if isinstance(key, tuple) and len(key) == 1:
        key = key[0]
    return names[key] if isinstance(key, int) and key < len(names) else key


def print_variants() -> None:
    """Registers and spills of each compiled variant of the kernel (key splits add the merge's registers)."""
    from roseinfer.kernels.paged_prefill_attention import _prefill_kernel

    for cache in getattr(_prefill_kernel, "device_caches", {}).values():
        for kernel in cache[0].values():
            c = getattr(kernel, "src", None)
            consts = getattr(c, "constants", {}) if c is not None else {}
            named = {_arg_name(_prefill_kernel.arg_names, k): v for k, v in consts.items()}
            keys = ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "TILE_MAP", "KEY_SPLIT")
            shown = " ".join(f"{k}={named.get(k, '?')}" for k in keys)
            print(f"variant {shown}: {kernel.n_regs} registers, {kernel.n_spills} spills")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-keys", default="128,256,512")
    parser.add_argument("--programs-per-sm", default="1,2,4")
    args = parser.parse_args()
    dev = torch.device("cuda")
    settings = [(int(k), int(p)) for k in args.min_keys.split(",") for p in args.programs_per_sm.split(",")]
    header = "".join(f"{f'k{k}/p{p}':>9s}" for k, p in settings)
    print(
        f"{'shape':14s}{'case':18s}{'grid':>6s}{'none':>6s}{'var':>6s}{'default':>8s}" + header + " programs"
    )
    for shape, heads in HEADS.items():
        default = key_split_for(heads[0], heads[2], torch.bfloat16, dev)
        for name, case in CASES.items():
            inputs = build(case, heads)
            q, k, v, tables, qsl, sl, _, _, longest = inputs
            grid = bench(
                functools.partial(
                    paged_prefill_attention, q, k, v, tables, qsl, sl, longest, heads[2] ** -0.5
                )
            )
            us, used = time_map(inputs, case, heads, default)
            cells = [
                f"{grid:6.1f}",
                f"{time_map(inputs, case, heads, None)[0]:6.1f}",
                f"{time_map(inputs, case, heads, None, split_variant=True)[0]:6.1f}",
                f"{us:8.1f}",
            ]
            for min_keys, per_sm in settings:
                split = KeySplit(default.num_heads, default.block_n, per_sm * num_sms(dev), min_keys)
                cells.append(f"{time_map(inputs, case, heads, split)[0]:9.1f}")
            print(f"{shape:14s}{name:18s}" + "".join(cells) + f" {used * heads[0]}")
    print("us of GPU time per launch (L2 flushed before each); k = min keys a split, p = programs per SM;")
    print_variants()
    print("grid: the plain launch without a tile map; none: a map without splits; var: the same map on the")
    print("variant that can merge splits; default: the engine's split setting")


if __name__ == "__main__":
    main()
