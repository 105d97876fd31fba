"""The decode chain's skinny GEMM tiles (`kernels/skinny_gemm.skinny_tile`) against every candidate tile, on
the engine's kernel: each of a qwen2.5-0.5b layer's four linears at a decode batch, over 24 layers' weights
back to back in a CUDA graph (us per launch, the split-K reduce included), with the shipped tile marked.
GPU only.

    python scripts/sweep_skinny_tiles.py --batches 16,64 [--block-n 16,32,64 --block-k 64,128,256 --stages 2,3,4]
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton

from roseinfer.bench.kernels import _graph_back_to_back_ms
from roseinfer.kernels._common import num_sms
from roseinfer.kernels.skinny_gemm import MAX_SPLIT, GemmTile, padded_rows, skinny_gemm, skinny_tile

LAYERS = 24
HIDDEN, QKV, INTER = 896, 1152, 4864  # qwen2.5-0.5b
# name: (N, K, adds into its output)
LINEARS = {"qkv": (QKV, HIDDEN, False), "o": (HIDDEN, HIDDEN, True), "gate_up": (2 * INTER, HIDDEN, False),
           "down": (HIDDEN, INTER, True)}  # fmt: skip


def candidates(
    n: int, k: int, sms: int, block_ns: list[int], block_ks: list[int], warps: list[int], stages: list[int]
) -> list[GemmTile]:
    tiles = []
    for bn, bk, warps_, stages_ in itertools.product(block_ns, block_ks, warps, stages):
        for split in (1, 2, 4, 8):
            if split > MAX_SPLIT or k // split < bk or (split > 1 and triton.cdiv(n, bn) * split > 4 * sms):
                continue
            tiles.append(GemmTile(bn, bk, split, warps_, stages_))
    return tiles


def us_per_launch(weights: list[torch.Tensor], x: torch.Tensor, out: torch.Tensor, add: bool, tile: GemmTile):
    def run() -> None:
        for w in weights:
            skinny_gemm(x, w, out=out, add=add, tile=tile)

    return _graph_back_to_back_ms(run, len(weights)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--warps", default="4")
    parser.add_argument("--block-n", default="16,32,64")
    parser.add_argument("--block-k", default="64,128,256")
    parser.add_argument("--stages", default="2,3,4")
    args = parser.parse_args()
    grid = [[int(v) for v in a.split(",")] for a in (args.block_n, args.block_k, args.warps, args.stages)]
    device = torch.device("cuda")
    sms = num_sms(device)
    gen = torch.Generator(device=device).manual_seed(0)
    for batch in (int(b) for b in args.batches.split(",")):
        for name, (n, k, add) in LINEARS.items():
            weights = [
                torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
                for _ in range(LAYERS)
            ]
            x = torch.randn(batch, k, device=device, dtype=torch.bfloat16, generator=gen)
            out = torch.zeros(batch, n, device=device, dtype=torch.bfloat16)
            shipped = skinny_tile(n, k, sms, padded_rows(batch))
            cands = candidates(n, k, sms, *grid)
            if shipped not in cands:
                cands.append(shipped)
            timed = []
            for t in cands:
                try:
                    timed.append((us_per_launch(weights, x, out, add, t), t))
                except triton.runtime.errors.OutOfResources:
                    pass  # too much shared memory for the GPU
            timed.sort(key=lambda r: r[0])
            shipped_us = next(us for us, t in timed if t == shipped)
            print(
                f"b={batch} {name} N={n} K={k}: shipped {shipped} {shipped_us:.2f} us; best of {len(timed)}:"
            )
            for us, t in timed[: args.top]:
                print(f"    {us:6.2f} us ({us / shipped_us - 1:+.1%})  {t}")


if __name__ == "__main__":
    main()
