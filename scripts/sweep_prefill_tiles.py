"""Paged prefill attention's q tile height (BLOCK_M) and key tile (BLOCK_N) on the chunks mixed steps carry:
a short chunk over a long cached prefix gives few q tiles (tiles x heads programs), which may not fill the
GPU at the default 128-row tile.

Times one launch (triton's do_bench, median) per (shape, case, tile) and prints us and TFLOP/s.

    python scripts/sweep_prefill_tiles.py [--tiles 128x32,64x32,64x64,32x64]
"""

from __future__ import annotations

import argparse
import functools

import torch
import triton

from roseinfer.kernels.paged_prefill_attention import paged_prefill_attention

HEADS = {"llama-3.1-8b": (32, 8, 128), "qwen2.5-0.5b": (14, 2, 64)}
# (chunk tokens, cached prefix tokens) per sequence of the step
CASES = {
    "1 x 190 over 750": [(190, 750)],
    "1 x 100 over 900": [(100, 900)],
    "2 x 96 over 1000": [(96, 1000), (96, 1000)],
    "1 x 640 fresh": [(640, 0)],
    "1 x 1000 fresh": [(1000, 0)],
}


def build(case: list[tuple[int, int]], heads: tuple[int, int, int], block_size: int = 16):
    hq, hkv, d = heads
    dev = torch.device("cuda")
    total = sum(c for c, _ in case)
    seq_lens = [c + p for c, p in case]
    width = max(-(-s // block_size) for s in seq_lens)
    num_blocks = width * len(case) + 1
    k = torch.randn(num_blocks, block_size, hkv, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    tables = torch.arange(len(case) * width, device=dev, dtype=torch.int32).view(len(case), width) + 1
    q = torch.randn(total, hq, d, device=dev, dtype=torch.bfloat16)
    starts = [0]
    for c, _ in case:
        starts.append(starts[-1] + c)
    qsl = torch.tensor(starts, device=dev, dtype=torch.int32)
    sl = torch.tensor(seq_lens, device=dev, dtype=torch.int32)
    flops = sum(4 * hq * d * c * (p + c / 2) for c, p in case)
    return q, k, v, tables, qsl, sl, max(c for c, _ in case), flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", default="128x32,64x32,64x64,32x64")
    args = parser.parse_args()
    tiles = [tuple(map(int, t.split("x"))) for t in args.tiles.split(",")]
    print(f"{'shape':14s}{'case':20s}" + "".join(f"{f'{m}x{n} us':>14s}" for m, n in tiles))
    for shape, heads in HEADS.items():
        for name, case in CASES.items():
            q, k, v, tables, qsl, sl, longest, flops = build(case, heads)
            launch = functools.partial(
                paged_prefill_attention, q, k, v, tables, qsl, sl, longest, heads[2] ** -0.5
            )
            cells = []
            for m, n in tiles:
                fn = functools.partial(launch, block_m=m, block_n=n)
                us = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
                cells.append(f"{us:7.1f} ({flops / us / 1e6:4.0f})")
            print(f"{shape:14s}{name:20s}" + "".join(f"{c:>14s}" for c in cells))
    print("us per launch (TFLOP/s); do_bench zeroes L2 before each launch")


if __name__ == "__main__":
    main()
