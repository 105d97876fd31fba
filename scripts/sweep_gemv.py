"""One-token decode linears: the fused GEMV (kernels/gemv.py) per tile against cuBLAS plus the separate
norm / SiLU kernels, per GEMM of a decoder layer and per layer, at batch 1 (GPU only).

Each case is a CUDA graph over LAYERS distinct weight sets, replayed by triton's do_bench (which flushes L2
between replays). Prints per-layer microseconds and the weight bandwidth each reaches.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch.nn.functional as F

from roseinfer.bench.kernels import _graph_median_ms
from roseinfer.config import ModelConfig
from roseinfer.kernels.activation import silu_and_mul
from roseinfer.kernels.gemv import gemv
from roseinfer.kernels.rmsnorm import rmsnorm

SHAPES = {"llama-3.1-8b": 2, "qwen2.5-0.5b": 8}
TILES = [(bn, bk, w) for bn in (4, 8, 16, 32) for bk in (512, 1024, 2048) for w in (4, 8)]


def _layer(cfg: ModelConfig, gen: torch.Generator) -> dict[str, torch.Tensor | None]:
    dev, dt = torch.device("cuda"), torch.bfloat16
    h, i = cfg.hidden_size, cfg.intermediate_size
    qkv, q = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, cfg.num_heads * cfg.head_dim

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=dt, generator=gen) / shape[-1] ** 0.5

    return {
        "w_qkv": rnd(qkv, h), "b_qkv": rnd(qkv) if cfg.qkv_bias else None, "w_o": rnd(h, q),
        "w_gu": rnd(2 * i, h), "w_d": rnd(h, i), "ln1": 1 + rnd(h), "ln2": 1 + rnd(h),
        "x": rnd(1, h), "res": rnd(1, h), "attn": rnd(1, q), "act": rnd(1, i),
    }  # fmt: skip


def _gemms(L: dict[str, Any], eps: float) -> dict[str, tuple[Any, Any, int]]:
    """kind -> (separate ops, fused gemv taking a tile, weight bytes)."""
    return {
        "qkv+norm": (
            lambda: F.linear(rmsnorm(L["x"], L["ln1"], eps, L["res"]), L["w_qkv"], L["b_qkv"]),
            lambda t: gemv(L["res"], L["w_qkv"], bias=L["b_qkv"], norm_weight=L["ln1"], eps=eps, tile=t),
            L["w_qkv"].numel() * 2,
        ),
        "o+res": (
            lambda: F.linear(L["attn"], L["w_o"]),
            lambda t: gemv(L["attn"], L["w_o"], residual=L["res"], tile=t),
            L["w_o"].numel() * 2,
        ),
        "gate_up+norm+silu": (
            lambda: silu_and_mul(F.linear(rmsnorm(L["x"], L["ln2"], eps, L["res"]), L["w_gu"])),
            lambda t: gemv(L["res"], L["w_gu"], norm_weight=L["ln2"], eps=eps, gated=True, tile=t),
            L["w_gu"].numel() * 2,
        ),
        "down+res": (
            lambda: F.linear(L["act"], L["w_d"]),
            lambda t: gemv(L["act"], L["w_d"], residual=L["res"], tile=t),
            L["w_d"].numel() * 2,
        ),
    }


def _per_layer_us(fns: list[Any]) -> float:
    def run() -> None:
        for fn in fns:
            fn()

    return _graph_median_ms(run) * 1000 / len(fns)


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    print("shape          gemm               cublas_us  default_us  best_us  best_TBps  best_tile")
    for shape in sys.argv[1:] or list(SHAPES):
        with open(f"roseinfer/models/configs/{shape}.json") as fh:
            cfg = ModelConfig.from_dict(json.load(fh))
        gemms = [_gemms(_layer(cfg, gen), cfg.norm_eps) for _ in range(SHAPES[shape])]
        base_total = default_total = 0.0
        for kind in gemms[0]:
            base = _per_layer_us([g[kind][0] for g in gemms])
            timed = [(_per_layer_us([lambda f=g[kind][1], t=t: f(t) for g in gemms]), t) for t in TILES]
            default = _per_layer_us([lambda f=g[kind][1]: f(None) for g in gemms])
            us, tile = min(timed)
            base_total += base
            default_total += default
            tbps = gemms[0][kind][2] / us / 1e6
            print(f"{shape:<14} {kind:<18} {base:9.2f}  {default:10.2f}  {us:7.2f}  {tbps:9.2f}  {tile}")
        print(
            f"{shape:<14} {'LAYER (default)':<18} {base_total:9.2f}  {default_total:10.2f}  x{base_total / default_total:.2f}"
        )


if __name__ == "__main__":
    main()
