"""Paged prefill attention with and without key splits, on the chunks mixed steps and prefix-cache hits carry:
a short chunk over a long cached prefix, where one program a q tile walks every key while most SMs idle.

Times one tile-map launch (triton's do_bench, median) per (shape, case, split setting) and prints us; the
first column is the plain grid the eager path used before splits.

    PYTHONPATH=$PWD python scripts/sweep_prefill_splits.py [--min-keys 128,256,512] [--programs-per-sm 1,2,4]
"""

from __future__ import annotations

import argparse
import functools

import numpy as np
import torch
import triton

from roseinfer.kernels._common import num_sms
from roseinfer.kernels.paged_prefill_attention import paged_prefill_attention
from roseinfer.kernels.prefill_plan import (
    SPLIT_PARTIAL_ROWS,
    KeySplit,
    key_split_for,
    prefill_block_m,
    prefill_tile_map,
)

HEADS = {"llama-3.1-8b": (32, 8, 128), "qwen2.5-0.5b": (14, 2, 64)}
# (chunk tokens, cached prefix tokens) per sequence of the step
CASES = {
    "1 x 100 over 900": [(100, 900)],
    "1 x 190 over 750": [(190, 750)],
    "2 x 96 over 1000": [(96, 1000), (96, 1000)],
    "1 x 320 over 1500": [(320, 1500)],
    "1 x 32 over 3000": [(32, 3000)],
    "1 x 640 fresh": [(640, 0)],
}


def build(case: list[tuple[int, int]], heads: tuple[int, int, int], block_size: int = 16):
    hq, hkv, d = heads
    dev = torch.device("cuda")
    total = sum(c for c, _ in case)
    seq_lens = np.array([c + p for c, p in case], np.int32)
    width = max(-(-int(s) // block_size) for s in seq_lens)
    num_blocks = width * len(case) + 1
    k = torch.randn(num_blocks, block_size, hkv, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    tables = torch.arange(len(case) * width, device=dev, dtype=torch.int32).view(len(case), width) + 1
    q = torch.randn(total, hq, d, device=dev, dtype=torch.bfloat16)
    starts = np.concatenate([[0], np.cumsum([c for c, _ in case])]).astype(np.int32)
    qsl = torch.from_numpy(starts).to(dev)
    sl = torch.from_numpy(seq_lens).to(dev)
    return q, k, v, tables, qsl, sl, starts, seq_lens, max(c for c, _ in case)


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def time_map(inputs, case, heads, split: KeySplit | None) -> tuple[float, int]:
    """(us, programs a head) of the tile-map launch for `case`, cutting keys as `split` allows."""
    q, k, v, tables, qsl, sl, starts, seq_lens, longest = inputs
    block_m = prefill_block_m(heads[2], torch.bfloat16, longest)
    n_tiles = int(sum(-(-c // block_m) for c, _ in case))
    tiles = prefill_tile_map(starts, seq_lens, 0, block_m, n_tiles + 64, split)
    used = int((tiles[0] >= 0).sum())
    t = torch.from_numpy(tiles[:, :used].copy()).to(q.device)
    rows = SPLIT_PARTIAL_ROWS if split is not None else 0
    fn = functools.partial(
        paged_prefill_attention, q, k, v, tables, qsl, sl, longest, heads[2] ** -0.5,
        block_m=block_m, tiles=t, split_rows=rows,
    )  # fmt: skip
    return bench(fn), used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-keys", default="128,256,512")
    parser.add_argument("--programs-per-sm", default="1,2,4")
    args = parser.parse_args()
    dev = torch.device("cuda")
    settings = [(int(k), int(p)) for k in args.min_keys.split(",") for p in args.programs_per_sm.split(",")]
    header = "".join(f"{f'k{k}/p{p}':>10s}" for k, p in settings)
    print(f"{'shape':14s}{'case':20s}{'grid':>8s}{'no split':>10s}{'default':>10s}" + header + "  programs")
    for shape, heads in HEADS.items():
        default = key_split_for(heads[0], heads[2], torch.bfloat16, dev)
        for name, case in CASES.items():
            inputs = build(case, heads)
            q, k, v, tables, qsl, sl, _, _, longest = inputs
            grid = bench(
                functools.partial(paged_prefill_attention, q, k, v, tables, qsl, sl, longest, heads[2] ** -0.5)
            )
            us, used = time_map(inputs, case, heads, default)
            cells = [f"{grid:8.1f}", f"{time_map(inputs, case, heads, None)[0]:10.1f}", f"{us:10.1f}"]
            for min_keys, per_sm in settings:
                split = KeySplit(default.num_heads, default.block_n, per_sm * num_sms(dev), min_keys)
                cells.append(f"{time_map(inputs, case, heads, split)[0]:10.1f}")
            print(f"{shape:14s}{name:20s}" + "".join(cells) + f"  {used * heads[0]}")
    print("us per launch (do_bench median, L2 zeroed before each); k = min keys a split, p = programs per SM;")
    print("grid = the plain launch without a tile map; default = the engine's split setting")


if __name__ == "__main__":
    main()
