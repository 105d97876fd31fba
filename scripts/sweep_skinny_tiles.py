"""The decode chain's skinny GEMM tiles (`kernels/skinny_gemm.skinny_tile`) against every candidate tile, on
the engine's kernel: each of a layer's four linears at a decode batch, over every layer's weights back to
back in a CUDA graph (us per launch, the split-K reduce included), with the shipped tile and cuBLAS (torch's
GEMM, as the engine runs it off the chain) marked. GPU only.

    python scripts/sweep_skinny_tiles.py --model-shape qwen2.5-0.5b --batches 16,64 \
        [--block-n 16,32,64 --block-k 64,128,256 --stages 2,3,4]
"""

from __future__ import annotations

import argparse
import itertools
import os

import torch
import triton

from roseinfer.bench.kernels import _graph_back_to_back_ms
from roseinfer.config import ModelConfig
from roseinfer.kernels._common import num_sms
from roseinfer.kernels.skinny_gemm import MAX_SPLIT, GemmTile, padded_rows, skinny_gemm, skinny_tile
from roseinfer.models.loader import BUILTIN_CONFIG_DIR


def linears(cfg: ModelConfig) -> dict[str, tuple[int, int, bool]]:
    """A decoder layer's linears, name: (N, K, adds into its output)."""
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    return {"qkv": (qkv, hidden, False), "o": (hidden, cfg.num_heads * cfg.head_dim, True),
            "gate_up": (2 * inter, hidden, False), "down": (hidden, inter, True)}  # fmt: skip


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


def us_per_launch(
    weights: list[torch.Tensor], x: torch.Tensor, out: torch.Tensor, add: bool, tile: GemmTile | None
) -> float:
    """us a launch of the skinny kernel at `tile`, or of torch's GEMM (cuBLAS) with `tile` None."""

    def run() -> None:
        for w in weights:
            if tile is None and add:
                out.addmm_(x, w.t())
            elif tile is None:
                torch.mm(x, w.t(), out=out)
            else:
                skinny_gemm(x, w, out=out, add=add, tile=tile)

    return _graph_back_to_back_ms(run, len(weights)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-shape", default="qwen2.5-0.5b")
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--warps", default="4")
    parser.add_argument("--block-n", default="16,32,64")
    parser.add_argument("--block-k", default="64,128,256")
    parser.add_argument("--stages", default="2,3,4")
    args = parser.parse_args()
    grid = [[int(v) for v in a.split(",")] for a in (args.block_n, args.block_k, args.warps, args.stages)]
    cfg = ModelConfig.from_path(os.path.join(BUILTIN_CONFIG_DIR, f"{args.model_shape}.json"))
    device = torch.device("cuda")
    sms = num_sms(device)
    gen = torch.Generator(device=device).manual_seed(0)
    for batch in (int(b) for b in args.batches.split(",")):
        for name, (n, k, add) in linears(cfg).items():
            weights = [
                torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
                for _ in range(cfg.num_layers)
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
            cublas_us = us_per_launch(weights, x, out, add, None)
            mb = n * k * 2 / 1e6
            print(
                f"b={batch} {name} N={n} K={k} ({mb:.1f} MB): shipped {shipped} {shipped_us:.2f} us "
                f"({mb / shipped_us:.2f} TB/s); cuBLAS {cublas_us:.2f} us ({cublas_us / shipped_us - 1:+.1%}); "
                f"best of {len(timed)}:"
            )
            for us, t in timed[: args.top]:
                print(f"    {us:6.2f} us ({us / shipped_us - 1:+.1%})  {t}")


if __name__ == "__main__":
    main()
