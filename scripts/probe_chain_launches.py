"""Fewer launches in the PDL decode chain: what does each one removed buy? (GPU; `--check` runs the chains
under the Triton interpreter and compares them with fp32.)

The engine's chained qwen2.5-0.5b decode layer (`pdl_decode`, eighteenth session) launches, besides
attention: qkv; o (split-K) and its reduce; gate_up; SiLU; down (split-K) and its reduce. This probe times
one layer's GEMM chain (attention left out) over 24 distinct weight sets in one CUDA graph, every launch
with PDL, as:
- `now`: the engine's launches (`skinny_gemm`, `silu_and_mul` applying the deferred norm);
- `fused`: gate_up with SiLU and the deferred norm in its epilogue (`gate_up_silu`): one launch less;
- `atomic32`: `now` on a float32 residual stream that o and down add their split-K shares into with
  atomics: no reduce launches (two launches a layer fewer);
- `atomic16`: the same atomics into the bf16 stream (no float32 stream, but rounded at every add);
- `shares`: gate_up as split-K shares that the SiLU launch adds up as it reads them (`skinny_gemm_shares`):
  no reduce launch, so gate_up may take wide tiles that read x fewer times;
- with `--sweep GROUP`, tile variants of these (`SWEEPS`).

    python scripts/probe_chain_launches.py --batches 64,16,32 --sweep atomic32
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from roseinfer.kernels.activation import silu_and_mul
from roseinfer.kernels.gate_up_silu import gate_up_silu
from roseinfer.kernels.skinny_gemm import GemmTile, skinny_gemm, skinny_gemm_shares

LAYERS = 24
HIDDEN, QKV_OUT, INTER = 896, 1152, 4864  # qwen2.5-0.5b
EPS = 1e-6


@dataclass
class Layer:
    w_qkv: torch.Tensor
    w_o: torch.Tensor
    w_gu: torch.Tensor
    w_d: torch.Tensor


@dataclass(frozen=True)
class Chain:
    fused: bool = False
    shares: bool = False
    residual: torch.dtype = torch.bfloat16
    atomic: bool = False
    tiles: dict[str, GemmTile] = field(default_factory=dict)


def make_layers(count: int, device: torch.device, gen: torch.Generator, dtype: torch.dtype) -> list[Layer]:
    def weight(n: int, k: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(n, k, device=device, generator=gen) * (scale * k**-0.5)).to(dtype)

    return [
        Layer(
            weight(QKV_OUT, HIDDEN),
            weight(HIDDEN, HIDDEN, 0.05),
            weight(2 * INTER, HIDDEN),
            weight(HIDDEN, INTER, 0.05),
        )
        for _ in range(count)
    ]


def run_layer(chain: Chain, layer: Layer, x: torch.Tensor, pdl: bool) -> None:
    """One layer on the residual stream x, in place (norm weights taken as folded into the weights)."""
    t = chain.tiles
    qkv = skinny_gemm(x, layer.w_qkv, pdl=pdl, tile=t.get("qkv"))
    attn = qkv[:, :HIDDEN]  # attention's output stands in: same shape, written by the launch before
    skinny_gemm(attn, layer.w_o, out=x, add=True, pdl=pdl, tile=t.get("o"), atomic=chain.atomic)
    if chain.fused:
        act = gate_up_silu(x, layer.w_gu, EPS, pdl=pdl, tile=t.get("gate_up"))
    elif chain.shares:
        parts = skinny_gemm_shares(x, layer.w_gu, pdl=pdl, tile=t.get("gate_up"))
        act = silu_and_mul(parts, x, EPS, pdl, out_dtype=layer.w_gu.dtype)
    else:
        act = silu_and_mul(skinny_gemm(x, layer.w_gu, pdl=pdl, tile=t.get("gate_up")), x, EPS, pdl)
    skinny_gemm(act, layer.w_d, out=x, add=True, pdl=pdl, tile=t.get("down"), atomic=chain.atomic)


def run_ref(layer: Layer, x: torch.Tensor) -> torch.Tensor:
    """The layer in float64."""
    f = torch.float64
    x = x.to(f)
    qkv = x @ layer.w_qkv.to(f).t()
    x = x + qkv[:, :HIDDEN] @ layer.w_o.to(f).t()
    gu = (x @ layer.w_gu.to(f).t()) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    g, u = gu.chunk(2, dim=-1)
    return x + (torch.nn.functional.silu(g) * u) @ layer.w_d.to(f).t()


CHAINS: dict[str, Chain] = {
    "now": Chain(),
    "fused": Chain(fused=True),
    "shares": Chain(shares=True),
    "atomic32": Chain(residual=torch.float32, atomic=True),
    "atomic16": Chain(atomic=True),
}
# tile variants, one GEMM at a time (GemmTile(block_n, block_k, split, warps, stages)), in the chain named
BK64 = {"qkv": GemmTile(16, 64, 1, 4, 4), "gate_up": GemmTile(32, 64, 1, 4, 4)}


def _tile_name(t: GemmTile) -> str:
    return f"{t.block_n}x{t.block_k}/{t.split} w{t.num_warps} s{t.num_stages}"


def _variants(base: str, gemm: str, tiles: tuple[GemmTile, ...], extra: dict[str, GemmTile] | None = None):
    return [(f"{base}, {gemm} {_tile_name(t)}", base, {**(extra or {}), gemm: t}) for t in tiles]


# tile variants, one GEMM at a time (GemmTile(block_n, block_k, split, warps, stages)), by group: (name,
# chain, tiles)
SWEEPS: dict[str, list[tuple[str, str, dict[str, GemmTile]]]] = {
    "fused": [
        *_variants(
            "fused",
            "gate_up",
            (
                GemmTile(32, 128, 1, 4, 2),
                GemmTile(32, 64, 1, 4, 4),
                GemmTile(64, 128, 1, 4, 3),
                GemmTile(64, 128, 1, 8, 3),
                GemmTile(64, 128, 1, 4, 2),
                GemmTile(64, 64, 1, 4, 4),
                GemmTile(64, 256, 1, 8, 2),
                GemmTile(128, 64, 1, 8, 3),
                GemmTile(128, 128, 1, 8, 2),
            ),
        ),
        *_variants("fused", "o", (GemmTile(16, 128, 1), GemmTile(32, 128, 1), GemmTile(16, 64, 1, 4, 4))),
        *_variants(
            "fused", "down", (GemmTile(16, 128, 1, 4, 4), GemmTile(16, 256, 1, 4, 3), GemmTile(32, 128, 2))
        ),
    ],
    "shares": [
        *_variants(
            "shares",
            "gate_up",
            (
                GemmTile(32, 128, 1),
                GemmTile(64, 128, 1),
                GemmTile(64, 128, 2),
                GemmTile(64, 128, 4),
                GemmTile(128, 128, 2),
                GemmTile(128, 128, 4),
                GemmTile(128, 128, 2, 8, 3),
                GemmTile(128, 64, 2, 4, 4),
            ),
        ),
        *_variants(
            "now",
            "down",
            (
                GemmTile(64, 128, 8),
                GemmTile(64, 128, 16),
                GemmTile(128, 128, 16),
                GemmTile(64, 64, 16, 4, 4),
                GemmTile(32, 128, 16),
            ),
        ),
        *_variants("now", "qkv", (GemmTile(32, 128, 1), GemmTile(64, 128, 1), GemmTile(16, 64, 1, 4, 4))),
    ],
    "atomic32": [
        ("atomic32, qkv + gate_up bk 64 s4", "atomic32", BK64),
        *_variants(
            "atomic32",
            "gate_up",
            (
                GemmTile(32, 64, 1, 4, 5),
                GemmTile(32, 64, 1, 4, 6),
                GemmTile(32, 128, 1, 4, 4),
                GemmTile(64, 64, 1, 4, 4),
                GemmTile(16, 64, 1, 4, 4),
                GemmTile(16, 128, 1, 4, 4),
            ),
            BK64,
        ),
        *_variants("atomic32", "qkv", (GemmTile(16, 64, 1, 4, 6), GemmTile(16, 128, 1, 4, 4)), BK64),
        *_variants("atomic32", "o", (GemmTile(32, 128, 8),), BK64),
        *_variants("atomic32", "down", (GemmTile(32, 128, 16),), BK64),
        *_variants("atomic16", "o", (GemmTile(32, 128, 8),)),
    ],
}


def graph_us_per_layer(fn: Callable[[], None]) -> float:
    from roseinfer.bench.kernels import _graph_back_to_back_ms

    return _graph_back_to_back_ms(fn, LAYERS) * 1e3


def chains_to_time(sweep: str | None) -> dict[str, Chain]:
    out = dict(CHAINS)
    if sweep:
        for name, base, tiles in SWEEPS[sweep]:
            c = CHAINS[base]
            out[name] = Chain(c.fused, c.shares, c.residual, c.atomic, tiles)
    return out


def probe(batch: int, rounds: int, sweep: str | None) -> None:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    layers = make_layers(LAYERS, device, gen, torch.bfloat16)
    x0 = torch.randn(batch, HIDDEN, device=device, generator=gen)
    chains = chains_to_time(sweep)
    streams = {name: x0.to(c.residual, copy=True) for name, c in chains.items()}

    def runner(name: str) -> Callable[[], None]:
        chain, x = chains[name], streams[name]

        def run() -> None:
            for layer in layers:
                run_layer(chain, layer, x, pdl=True)

        return run

    expect = run_ref(layers[0], x0)
    print(f"qwen2.5-0.5b layer GEMM chain, batch {batch}, PDL, us a layer ({rounds} rounds), one-layer error")
    times: dict[str, list[float]] = {name: [] for name in chains}
    for _ in range(rounds):
        for name in chains:
            times[name].append(graph_us_per_layer(runner(name)))
    for name, chain in chains.items():
        x = x0.to(chain.residual, copy=True)
        run_layer(chain, layers[0], x, pdl=False)
        err = (x.double() - expect).abs().max().item()
        ts = sorted(times[name])
        print(
            f"  {name:44s} {ts[len(ts) // 2]:7.2f}  ({' / '.join(f'{t:.2f}' for t in times[name])})  err {err:.3g}"
        )


def cpu_check() -> None:
    """Every chain, one small layer under the interpreter, against float64."""
    global HIDDEN, QKV_OUT, INTER
    HIDDEN, QKV_OUT, INTER = 64, 96, 80
    gen = torch.Generator().manual_seed(0)
    layer = make_layers(1, torch.device("cpu"), gen, torch.float32)[0]
    x0 = torch.randn(5, HIDDEN, generator=gen)
    expect = run_ref(layer, x0)
    small = {
        "qkv": GemmTile(16, 32, 1),
        "o": GemmTile(16, 32, 2),
        "gate_up": GemmTile(16, 32, 2),
        "down": GemmTile(16, 32, 3),
    }
    for name, chain in CHAINS.items():
        chain = Chain(chain.fused, chain.shares, torch.float32, chain.atomic, small)
        x = x0.clone()
        run_layer(chain, layer, x, pdl=False)
        print(f"{name:20s} max error {(x.double() - expect).abs().max().item():.3g}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="64,16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sweep", choices=sorted(SWEEPS), help="also this group's tile variants")
    p.add_argument("--check", action="store_true", help="interpreter check on the CPU, then exit")
    args = p.parse_args()
    if args.check:
        cpu_check()
        return
    for batch in (int(b) for b in args.batches.split(",")):
        probe(batch, args.rounds, args.sweep)


if __name__ == "__main__":
    main()
