"""Fused few-token linears (kernels/fused_linear.py) against cuBLAS plus the separate norm / SiLU kernels,
per GEMM of a decoder layer and per layer chain, at decode batch sizes (GPU only).

Each case is a CUDA graph over LAYERS distinct weight sets (so weights come from DRAM, not L2), replayed by
triton's do_bench (which also flushes L2 between replays). Prints per-layer microseconds; writes the best
tile per (shape, M, GEMM) as JSON to $OUT/fused_linear_tiles.json when OUT is set.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.nn.functional as F

from roseinfer.bench.kernels import _graph_median_ms
from roseinfer.config import ModelConfig
from roseinfer.kernels.activation import silu_and_mul
from roseinfer.kernels.fused_linear import LinearTile, fused_linear
from roseinfer.kernels.rmsnorm import rmsnorm

SHAPES = {"qwen2.5-0.5b": ((1, 16, 64, 128, 256), 8), "llama-3.1-8b": ((1, 16, 64, 128), 2)}


def _tiles(m: int) -> list[LinearTile]:
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    out = [LinearTile(bm, bn, bk, 4, st) for bn in (16, 32, 64) for bk in (128, 256) for st in (3, 4)]
    out += [
        LinearTile(bm, bn, bk, 4, st, swap_ab=True) for bn in (64, 128) for bk in (128, 256) for st in (3, 4)
    ]
    return out


class Layer:
    def __init__(self, cfg: ModelConfig, m: int, gen: torch.Generator) -> None:
        dev, dt = torch.device("cuda"), torch.bfloat16
        h, i = cfg.hidden_size, cfg.intermediate_size
        qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        q = cfg.num_heads * cfg.head_dim

        def rnd(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, device=dev, dtype=dt, generator=gen) / shape[-1] ** 0.5).contiguous()

        self.w_qkv, self.b_qkv = rnd(qkv, h), (rnd(qkv) if cfg.qkv_bias else None)
        self.w_o, self.w_gu, self.w_d = rnd(h, q), rnd(2 * i, h), rnd(h, i)
        self.ln1, self.ln2 = 1 + rnd(h), 1 + rnd(h)
        self.attn = rnd(m, q)
        self.res = rnd(m, h)
        self.x = rnd(m, h)
        self.act = rnd(m, i)


def _gemms(layer: Layer, eps: float) -> dict[str, tuple[Any, Any]]:
    """kind -> (unfused callable, fused callable taking a tile)."""
    L = layer
    return {
        "qkv+norm": (
            lambda: F.linear(rmsnorm(L.x, L.ln1, eps, L.res), L.w_qkv, L.b_qkv),
            lambda t: fused_linear(L.res, L.w_qkv, bias=L.b_qkv, norm_weight=L.ln1, eps=eps, tile=t),
        ),
        "o+res": (
            lambda: F.linear(L.attn, L.w_o),
            lambda t: fused_linear(L.attn, L.w_o, residual=L.res, out=L.res, tile=t),
        ),
        "gate_up+norm+silu": (
            lambda: silu_and_mul(F.linear(rmsnorm(L.x, L.ln2, eps, L.res), L.w_gu)),
            lambda t: fused_linear(L.res, L.w_gu, norm_weight=L.ln2, eps=eps, gated=True, tile=t),
        ),
        "down+res": (
            lambda: F.linear(L.act, L.w_d),
            lambda t: fused_linear(L.act, L.w_d, residual=L.res, out=L.res, tile=t),
        ),
    }


def _per_layer_us(fns: list[Any]) -> float:
    def run() -> None:
        for fn in fns:
            fn()

    return _graph_median_ms(run) * 1000 / len(fns)


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    only = sys.argv[1:] or list(SHAPES)
    best: dict[str, Any] = {}
    print("shape          M    gemm               cublas_us  fused_us  tile")
    for shape in only:
        ms, n_layers = SHAPES[shape]
        cfg = ModelConfig.from_dict(json.load(open(f"roseinfer/models/configs/{shape}.json")))
        for m in ms:
            layers = [Layer(cfg, m, gen) for _ in range(n_layers)]
            gemms = [_gemms(layer, cfg.norm_eps) for layer in layers]
            picked: dict[str, LinearTile] = {}
            for kind in gemms[0]:
                base = _per_layer_us([g[kind][0] for g in gemms])
                timed = []
                for tile in _tiles(m):
                    try:
                        timed.append(
                            (_per_layer_us([lambda f=g[kind][1], t=tile: f(t) for g in gemms]), tile)
                        )
                    except Exception as exc:  # a tile that does not fit (shared memory) is skipped
                        print(f"  skip {tile}: {type(exc).__name__}")
                us, tile = min(timed, key=lambda x: x[0])
                picked[kind] = tile
                best[f"{shape}/{m}/{kind}"] = {"us": us, "cublas_us": base, **tile.__dict__}
                print(f"{shape:<14} {m:<4} {kind:<18} {base:9.2f}  {us:8.2f}  {tile}")

            chain_base = []
            chain_fused = []
            for g in gemms:
                chain_base += [g[k][0] for k in g]
                chain_fused += [lambda f=g[k][1], t=picked[k]: f(t) for k in g]
            b = _per_layer_us(chain_base) * 4
            f = _per_layer_us(chain_fused) * 4
            print(f"{shape:<14} {m:<4} {'LAYER (4 gemms)':<18} {b:9.2f}  {f:8.2f}  x{b / f:.2f}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "fused_linear_tiles.json"), "w") as fh:
            json.dump(best, fh, indent=1)


if __name__ == "__main__":
    main()
