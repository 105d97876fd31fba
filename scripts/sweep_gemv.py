"""One-token decode linears: the fused GEMV (`kernels/gemv.py`) per tile against cuBLAS plus the separate
norm / SiLU kernels it replaces, per GEMM of a decoder layer and for the lm_head, at batch 1 (GPU only).

    python scripts/sweep_gemv.py [shape ...] [--quick]

Each case is a CUDA graph over LAYERS distinct weight sets (more bytes than the L2 holds), replayed by
triton's do_bench. Prints microseconds per GEMM, the weight bandwidth reached and the best tile, then a
per-layer total: cuBLAS path vs GEMV with the engine's default tiles vs GEMV with the best tiles.
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

import torch
import torch.nn.functional as F

from roseinfer.bench.kernels import _copy_bandwidth_gbs, _graph_median_ms
from roseinfer.config import ModelConfig
from roseinfer.kernels.activation import silu_and_mul
from roseinfer.kernels.gemv import GemvTile, gemv, gemv_tile
from roseinfer.kernels.rmsnorm import rmsnorm

LAYERS = {"llama-3.1-8b": 2, "qwen2.5-0.5b": 8, "qwen3-0.6b": 8}
FULL = [
    GemvTile(bn, bk, w, s)
    for bn, bk, w, s in itertools.product((2, 4, 8, 16, 32), (128, 256, 512, 1024), (4, 8), (1, 2, 3))
    if 1024 <= bn * bk <= 16384
]
QUICK = [GemvTile(bn, bk, w, 3) for bn, bk, w in itertools.product((4, 8, 16), (256, 512, 1024), (4, 8))]


def _layer(cfg: ModelConfig, gen: torch.Generator) -> dict[str, Any]:
    dev, dt = torch.device("cuda"), torch.bfloat16
    h, i = cfg.hidden_size, cfg.intermediate_size
    qkv, q = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, cfg.num_heads * cfg.head_dim

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=dt, generator=gen) / shape[-1] ** 0.5

    return {
        "w_qkv": rnd(qkv, h), "b_qkv": rnd(qkv) if cfg.qkv_bias else None, "w_o": rnd(h, q),
        "w_gu": rnd(2 * i, h), "w_d": rnd(h, i), "ln1": 1 + rnd(h), "ln2": 1 + rnd(h), "w_lm": rnd(cfg.vocab_size, h),
        "x": rnd(1, h), "res": rnd(1, h), "attn": rnd(1, q), "act": rnd(1, i),
    }  # fmt: skip


def _gemms(L: dict[str, Any], eps: float) -> dict[str, tuple[Any, Any, int]]:
    """kind -> (cuBLAS + separate kernels, GEMV taking a tile, weight bytes)."""
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
        "lm_head": (
            lambda: F.linear(L["x"], L["w_lm"]),
            lambda t: gemv(L["x"], L["w_lm"], tile=t),
            L["w_lm"].numel() * 2,
        ),
    }


def _per_call_us(fns: list[Any]) -> float:
    def run() -> None:
        for fn in fns:
            fn()

    return _graph_median_ms(run) * 1000 / len(fns)


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    tiles = QUICK if "--quick" in sys.argv else FULL
    gbs, _ = _copy_bandwidth_gbs(torch.device("cuda"))
    print(
        f"# {torch.cuda.get_device_name()}  copy bandwidth {gbs / 1000:.2f} TB/s  tiles tried: {len(tiles)}"
    )
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for shape in args or ["llama-3.1-8b", "qwen2.5-0.5b"]:
        with open(f"roseinfer/models/configs/{shape}.json") as fh:
            cfg = ModelConfig.from_dict(json.load(fh))
        layers = [_layer(cfg, gen) for _ in range(LAYERS.get(shape, 4))]
        gemms = [_gemms(L, cfg.norm_eps) for L in layers]
        totals = [0.0, 0.0, 0.0]
        for kind in gemms[0]:
            base = _per_call_us([g[kind][0] for g in gemms])
            timed = [(_per_call_us([lambda f=g[kind][1], t=t: f(t) for g in gemms]), t) for t in tiles]
            default = _per_call_us([lambda f=g[kind][1]: f(None) for g in gemms])
            timed.sort()
            best, tile = timed[0]
            nbytes = gemms[0][kind][2]
            if kind != "lm_head":
                for j, v in enumerate((base, default, best)):
                    totals[j] += v
            w = layers[0]["w_gu"] if kind.startswith("gate") else None
            n = (w.shape[0] // 2) if w is not None else None
            rows.append(
                f"{shape:<13} {kind:<18} {base:8.2f} {nbytes / base / 1e6:6.2f} {default:8.2f} "
                f"{nbytes / default / 1e6:6.2f} {best:8.2f} {nbytes / best / 1e6:6.2f}  {tuple(tile)}"
                + (
                    f"  default {tuple(gemv_tile(n, cfg.hidden_size, True, torch.device('cuda')))}"
                    if n
                    else ""
                )
                + "  next: "
                + ", ".join(f"{us:.2f} {tuple(t)}" for us, t in timed[1:4])
            )
            print(rows[-1], flush=True)
        rows.append(
            f"{shape:<13} {'LAYER (4 GEMMs)':<18} {totals[0]:8.2f} {'':6} {totals[1]:8.2f} {'':6} {totals[2]:8.2f}"
            f"  cuBLAS / GEMV default = x{totals[0] / totals[1]:.3f}"
        )
        print(rows[-1], flush=True)
    print(
        "\nshape         gemm               cublas_us  TB/s  default_us  TB/s  best_us  TB/s  best tile (bn, bk, warps, stages)"
    )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
