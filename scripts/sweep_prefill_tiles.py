"""Paged prefill attention's tile config on fresh prompts and on the chunks mixed steps carry: the q tile
height (BLOCK_M), the key tile (BLOCK_N), and optionally warps and pipeline stages. A short chunk over a long
cached prefix gives few q tiles (tiles x heads programs), which may not fill the GPU at the default 128-row
tile.

Times one launch (triton's do_bench, median) per (shape, case, tile) and prints us and TFLOP/s. do_bench's events
wrap each launch: where a launch's host path outlasts the L2 flush before it, the host's time is in the figure
(short cases then read 30-165 us from call to call); `--graph` times it replayed in a CUDA graph. A tile is
MxN (warps and stages from `prefill_config`) or MxNxWxS. `--kv-cache-dtype fp8` reads K/V from an fp8 cache;
`--fp8-dots bf16,fp16` then times each dot type the K/V may widen to (`_common.attention_dot_dtype`).

    python scripts/sweep_prefill_tiles.py [--tiles 128x32,64x32,64x64,32x64,128x128x8x2] [--shapes llama-3.1-8b]

`--maps` times, replayed in CUDA graphs, the tile-map launches a mixed-step graph of the step's padded size may
take instead: the 64-row map with key splits (what the graphs launch) and LONG_TILE's map that cuts no key.
"""

from __future__ import annotations

import argparse
import functools

import numpy as np
import torch
import triton

import roseinfer.kernels.paged_prefill_attention as prefill
from roseinfer.kernels import paged_prefill_ws
from roseinfer.kernels.paged_prefill_attention import paged_prefill_attention
from roseinfer.kernels.prefill_plan import LONG_TILE, SPLIT_PARTIAL_ROWS, TilePlanner, prefill_tile_map
from roseinfer.kv.cache_dtype import KV_CACHE_DTYPES, resolve_kv_cache_dtype
from roseinfer.runner.mixed_graphs import MAX_CHUNKS, mixed_graph_sizes

HEADS = {"llama-3.1-8b": (32, 8, 128), "qwen3-0.6b": (16, 8, 128), "qwen2.5-0.5b": (14, 2, 64)}
# (chunk tokens, cached prefix tokens) per sequence of the step
CASES = {
    "4 x 2048 fresh": [(2048, 0)] * 4,
    "16 x 512 fresh": [(512, 0)] * 16,
    "1 x 190 over 750": [(190, 750)],
    "1 x 100 over 900": [(100, 900)],
    "2 x 96 over 1000": [(96, 1000), (96, 1000)],
    "1 x 640 fresh": [(640, 0)],
    "1 x 1000 fresh": [(1000, 0)],
    "1 x 1024 fresh": [(1024, 0)],
    # a mixed graph's 1024-token bucket (llama-3.1-8b's largest) holding several short chunks
    "8 x 128 fresh": [(128, 0)] * 8,
    "4 x 256 over 1000": [(256, 1000)] * 4,
    # W7's chunks (1024-token steps over 10240-token prompts), where vLLM's FA3 ran the prefill faster
    "1 x 1024 over 4096": [(1024, 4096)],
    "1 x 1024 over 9216": [(1024, 9216)],
    # where LONG_TILE starts to pay (prefill_plan.LONG_PREFIX_RATIO, LONG_TILE_WAVES)
    "1 x 1024 over 1024": [(1024, 1024)],
    "1 x 1024 over 2048": [(1024, 2048)],
    "1 x 2048 fresh": [(2048, 0)],
    "2 x 2048 fresh": [(2048, 0)] * 2,
    "1 x 4096 fresh": [(4096, 0)],
    # W7's chunk beside nine decodes (the step's budget is 1024 tokens), and shorter chunks over prefixes
    "1 x 1015 over 9216": [(1015, 9216)],
    "1 x 1015 over 2048": [(1015, 2048)],
    "1 x 768 over 4096": [(768, 4096)],
    "1 x 768 over 768": [(768, 768)],
    "1 x 512 over 4096": [(512, 4096)],
    "1 x 512 over 512": [(512, 512)],
    "2 x 512 over 2048": [(512, 2048)] * 2,
    "1 x 256 over 4096": [(256, 4096)],
    "1 x 512 over 1024": [(512, 1024)],
    "1 x 512 over 2048": [(512, 2048)],
    "4 x 256 over 4096": [(256, 4096)] * 4,
    "1 x 384 over 4096": [(384, 4096)],
    # W6's steps at hit rates 0.3-0.7 (1000-token prompts, a 1024-token budget), and multi-turn follow-ups
    "1 x 700 over 300": [(700, 300)],
    "1 x 500 over 500": [(500, 500)],
    "2 x 500 over 500": [(500, 500)] * 2,
    "3 x 300 over 700": [(300, 700)] * 3,
    "1 x 300 over 700": [(300, 700)],
    "1 x 256 over 256": [(256, 256)],
    "1 x 384 over 1024": [(384, 1024)],
    "2 x 256 over 2048": [(256, 2048)] * 2,
    "1 x 896 fresh": [(896, 0)],
    "1 x 768 fresh": [(768, 0)],
}


def build(
    case: list[tuple[int, int]],
    heads: tuple[int, int, int],
    block_size: int = 16,
    cache_dtype: torch.dtype = torch.bfloat16,
):
    hq, hkv, d = heads
    dev = torch.device("cuda")
    total = sum(c for c, _ in case)
    seq_lens = [c + p for c, p in case]
    width = max(-(-s // block_size) for s in seq_lens)
    num_blocks = width * len(case) + 1
    k = torch.randn(num_blocks, block_size, hkv, d, device=dev, dtype=torch.bfloat16).to(cache_dtype)
    v = torch.randn_like(k, dtype=torch.bfloat16).to(cache_dtype)
    tables = torch.arange(len(case) * width, device=dev, dtype=torch.int32).view(len(case), width) + 1
    q = torch.randn(total, hq, d, device=dev, dtype=torch.bfloat16)
    starts = [0]
    for c, _ in case:
        starts.append(starts[-1] + c)
    qsl = torch.tensor(starts, device=dev, dtype=torch.int32)
    sl = torch.tensor(seq_lens, device=dev, dtype=torch.int32)
    flops = sum(4 * hq * d * c * (p + c / 2) for c, p in case)
    return q, k, v, tables, qsl, sl, max(c for c, _ in case), flops


def with_warps_stages(launch, warps: int, stages: int):
    """`launch` with `prefill_config`'s warps and stages replaced (its tile comes from the call)."""
    shipped = prefill.prefill_config

    def run() -> None:
        prefill.prefill_config = lambda d, *dtypes: (*shipped(d, *dtypes)[:2], warps, stages)
        try:
            launch()
        finally:
            prefill.prefill_config = shipped

    return run


def with_dot_dtype(launch, dot: torch.dtype):
    """`launch` with its dots in `dot` (the type an fp8 cache's K/V widen to)."""
    shipped = prefill.attention_dot_dtype

    def run() -> None:
        prefill.attention_dot_dtype = lambda *_: dot
        try:
            launch()
        finally:
            prefill.attention_dot_dtype = shipped

    return run


def graph_maps(case: list[tuple[int, int]], heads: tuple[int, int, int], graph_max: int = 4096) -> dict:
    """The two tile maps a mixed-step graph of the step's padded size could launch for `case`, as
    (block_m, tiles, split_rows): the 64-row map with key splits, and LONG_TILE's map that cuts no key."""
    hq, _, d = heads
    sizes = mixed_graph_sizes(graph_max)
    total = sum(c for c, _ in case)
    size = next(s for s in sizes if s >= total)
    qsl = np.cumsum([0] + [c for c, _ in case])
    seq_lens = np.array([c + p for c, p in case])
    planner = TilePlanner(hq, d, torch.bfloat16, torch.device("cuda"))
    maps = {}
    for block_m, split in ((64, planner.split), (LONG_TILE[0], None)):
        q_tiles = -(-size // block_m) + min(size, MAX_CHUNKS)
        capacity = q_tiles + (planner.split_entries if split is not None else 0)
        tiles = prefill_tile_map(qsl, seq_lens, 0, block_m, capacity, split)
        rows = SPLIT_PARTIAL_ROWS if split is not None else 0
        maps[block_m] = (block_m, torch.from_numpy(tiles).cuda(), rows, int(tiles[3].max()))
    return maps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", default="128x32,64x32,64x64,32x64")
    parser.add_argument("--shapes", default=",".join(HEADS))
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=sorted(KV_CACHE_DTYPES))
    parser.add_argument(
        "--fp8-dots", default="", help="e.g. bf16,fp16: each dot type an fp8 cache's K/V widen to"
    )
    parser.add_argument(
        "--no-ws",
        action="store_true",
        help="the Triton kernel at 128 x 128 too (not the Hopper warp-specialised one)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="time each cell this many times, the tiles in turn, and keep the least median (a slow outlier "
        "from a clock dip or a neighbour on the host then cannot decide the row)",
    )
    parser.add_argument(
        "--graph",
        action="store_true",
        help="time each launch replayed in a CUDA graph (do_bench_cudagraph): no host time in it, but no L2 "
        "flush either (a short case's K/V may stay in L2)",
    )
    parser.add_argument(
        "--maps",
        action="store_true",
        help="time the mixed-step graph's 64-row key-split map against LONG_TILE's uncut map, in CUDA graphs",
    )
    args = parser.parse_args()
    if args.maps:
        return sweep_maps(args)
    paged_prefill_ws.ENABLED = not args.no_ws
    tiles = [tuple(map(int, t.split("x"))) for t in args.tiles.split(",")]
    dot_types = {"bf16": torch.bfloat16, "fp16": torch.float16}
    dots = [dot_types[t] for t in args.fp8_dots.split(",") if t] or [None]
    columns = [(t, dot) for t in tiles for dot in dots]
    cache_dtype = resolve_kv_cache_dtype(args.kv_cache_dtype, torch.bfloat16)
    print(f"K/V cache {cache_dtype}")
    head = [
        "x".join(map(str, t)) + (f" {str(dot).removeprefix('torch.')}" if dot else "") + " us"
        for t, dot in columns
    ]
    print(f"{'shape':14s}{'case':20s}" + "".join(f"{h:>24s}" for h in head))
    for shape in args.shapes.split(","):
        heads = HEADS[shape]
        for name in args.cases.split(","):
            q, k, v, tables, qsl, sl, longest, flops = build(CASES[name], heads, cache_dtype=cache_dtype)
            launch = functools.partial(
                paged_prefill_attention, q, k, v, tables, qsl, sl, longest, heads[2] ** -0.5
            )
            fns = []
            for (m, n, *warps_stages), dot in columns:
                fn = functools.partial(launch, block_m=m, block_n=n)
                if warps_stages:
                    fn = with_warps_stages(fn, *warps_stages)
                if dot is not None:
                    fn = with_dot_dtype(fn, dot)
                fns.append(fn)
            best = [float("inf")] * len(fns)
            for _ in range(args.repeats):
                for i, fn in enumerate(fns):
                    if args.graph:
                        us = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
                    else:
                        us = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
                    best[i] = min(best[i], us)
            cells = [f"{us:7.1f} ({flops / us / 1e6:4.0f})" for us in best]
            print(f"{shape:14s}{name:20s}" + "".join(f"{c:>24s}" for c in cells), flush=True)
    print(
        f"us per launch (TFLOP/s), the least median of {args.repeats}; do_bench zeroes L2 before each launch"
    )


def sweep_maps(args: argparse.Namespace) -> None:
    print(f"{'shape':14s}{'case':20s}{'64 map us':>12s}{'splits':>8s}{'128 uncut us':>14s}{'ratio':>7s}")
    for shape in args.shapes.split(","):
        heads = HEADS[shape]
        for name in args.cases.split(","):
            q, k, v, tables, qsl, sl, _, flops = build(CASES[name], heads)
            if q.shape[0] > 4096:
                continue
            best = {}
            splits = 1
            for block_m, tiles, rows, most in graph_maps(CASES[name], heads).values():
                fn = functools.partial(
                    paged_prefill_attention, q, k, v, tables, qsl, sl, q.shape[0], heads[2] ** -0.5,
                    block_m=block_m, tiles=tiles, split_rows=rows,
                )  # fmt: skip
                splits = max(splits, most)
                times = [
                    triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
                    for _ in range(args.repeats)
                ]
                best[block_m] = min(times)
            short, long = best[64], best[LONG_TILE[0]]
            print(f"{shape:14s}{name:20s}{short:12.1f}{splits:8d}{long:14.1f}{long / short:7.2f}", flush=True)
    print(f"us per replay, the least median of {args.repeats}; ratio < 1: LONG_TILE's uncut map is faster")


if __name__ == "__main__":
    main()
