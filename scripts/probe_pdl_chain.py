"""Can programmatic dependent launch hide a small model's per-kernel fixed cost, once every kernel in the
chain is ours? (GPU only for timings; `--check` runs the kernels under the Triton interpreter.)

A qwen2.5-0.5b decode step at batch 64 is ~2.4x its byte floor: ~190 launches a step, each paying ~3-4 us of
its own ramp and tail (PERFORMANCE.md, tenth and eleventh sessions). The fourth session launched our
elementwise kernels with PDL and lost 1-2%, but their predecessors were cuBLAS GEMMs, which are not launched
that way, so nothing could overlap. This probe times one decode layer's GEMM chain with every kernel a
Triton kernel:

    qkv = x @ Wqkv.T;  x += qkv[:, :H] @ Wo.T;  gu = x @ Wgu.T;  s = silu(g) * u;  x += s @ Wd.T

(the attention between qkv and o is left out), over LAYERS distinct weight sets in one CUDA graph, as:
- `cublas`: torch.mm / addmm_ (the engine's GEMMs) and the Triton SiLU;
- `triton`: a skinny Triton GEMM (split-K with a reduce launch where it pays), no PDL;
- `pdl`: the same launched with PDL; each kernel waits (`gdc_wait`) before reading its predecessor's output
  and lets its dependent launch once it is past the wait;
- `pdl+early`: the dependent may launch as soon as a kernel starts;
- `pdl+first`: the first K step's weights are loaded before the wait (`+early` as above);
- `pdl+prefetch`: before the wait each GEMM program pulls its weight slice into L2
  (`cp.async.bulk.prefetch.L2`), so weight reads overlap the predecessor;
- `{K}k...`: tiles of one K step a program (K in shares of `--one-step-ks`), plain, and with PDL and all
  their weights loaded before the wait (`+preload`, `+early`).
Every chain is checked against an fp32 reference for one layer, and its 24-layer graph replay against the
plain Triton chain's (bit for bit where the tiles are the same).
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
from pdl_chain_kernels import Launch, Tile, gemm, silu_mul

LAYERS = 24
SHAPES = {
    "qwen2.5-0.5b": (896, 1152, 4864),
    "qwen3-0.6b": (1024, 4096, 3072),
}  # hidden, qkv out, intermediate


@dataclass
class Layer:
    w_qkv: torch.Tensor
    w_o: torch.Tensor
    w_gu: torch.Tensor
    w_d: torch.Tensor


@dataclass
class Buffers:
    x: torch.Tensor
    qkv: torch.Tensor
    gu: torch.Tensor
    s: torch.Tensor
    part: torch.Tensor


def make_layers(
    shape: str, count: int, device: torch.device, gen: torch.Generator, dtype: torch.dtype = torch.bfloat16
) -> list[Layer]:
    hidden, qkv_out, inter = SHAPES[shape]

    def weight(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, device=device, generator=gen) * k**-0.5).to(dtype)

    # scaled down so that the stream, with no norm in the chain, stays O(1) over many replays
    return [
        Layer(
            weight(qkv_out, hidden),
            weight(hidden, hidden) * 0.05,
            weight(2 * inter, hidden) * 0.2,
            weight(hidden, inter) * 0.05,
        )
        for _ in range(count)
    ]


def make_buffers(
    shape: str, batch: int, device: torch.device, gen: torch.Generator, dtype: torch.dtype = torch.bfloat16
) -> Buffers:
    hidden, qkv_out, inter = SHAPES[shape]
    bf16 = dtype
    return Buffers(
        x=torch.randn(batch, hidden, device=device, generator=gen).to(bf16),
        qkv=torch.empty(batch, qkv_out, device=device, dtype=bf16),
        gu=torch.empty(batch, 2 * inter, device=device, dtype=bf16),
        s=torch.empty(batch, inter, device=device, dtype=bf16),
        part=torch.empty(8 * batch * max(2 * inter, qkv_out), device=device, dtype=torch.float32),
    )


def layer_ref(layer: Layer, x: torch.Tensor) -> torch.Tensor:
    """The chain in fp32 from bf16 inputs, rounding where the kernels store bf16."""
    hidden = x.shape[1]
    inter = layer.w_d.shape[1]
    f = torch.float32
    qkv = (x.to(f) @ layer.w_qkv.to(f).t()).to(x.dtype)
    x = (x.to(f) + qkv[:, :hidden].to(f) @ layer.w_o.to(f).t()).to(x.dtype)
    gu = (x.to(f) @ layer.w_gu.to(f).t()).to(x.dtype)
    g, u = gu[:, :inter].to(f), gu[:, inter:].to(f)
    s = (g * torch.sigmoid(g) * u).to(x.dtype)
    return (x.to(f) + s.to(f) @ layer.w_d.to(f).t()).to(x.dtype)


def layer_triton(layer: Layer, b: Buffers, tiles: dict[str, Tile], launch: Launch) -> None:
    hidden = b.x.shape[1]
    gemm(b.x, layer.w_qkv, b.qkv, b.part, tiles["qkv"], launch, add=False)
    gemm(b.qkv[:, :hidden], layer.w_o, b.x, b.part, tiles["o"], launch, add=True)
    gemm(b.x, layer.w_gu, b.gu, b.part, tiles["gate_up"], launch, add=False)
    silu_mul(b.gu, b.s, launch)
    gemm(b.s, layer.w_d, b.x, b.part, tiles["down"], launch, add=True)


def layer_cublas(layer: Layer, b: Buffers) -> None:
    hidden = b.x.shape[1]
    torch.mm(b.x, layer.w_qkv.t(), out=b.qkv)
    b.x.addmm_(b.qkv[:, :hidden], layer.w_o.t())
    torch.mm(b.x, layer.w_gu.t(), out=b.gu)
    silu_mul(b.gu, b.s, Launch())
    b.x.addmm_(b.s, layer.w_d.t())


def check(
    shape: str,
    batch: int,
    tiles: dict[str, Tile],
    launch: Launch,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
) -> float:
    """Max abs error of one Triton layer against `layer_ref`."""
    gen = torch.Generator(device=device).manual_seed(1)
    layer = make_layers(shape, 1, device, gen, dtype)[0]
    b = make_buffers(shape, batch, device, gen, dtype)
    expect = layer_ref(layer, b.x.clone())
    layer_triton(layer, b, tiles, launch)
    return (b.x.float() - expect.float()).abs().max().item()


def graph_us_per_layer(fn: Callable[[], None], layers: int) -> float:
    from roseinfer.bench.kernels import _graph_back_to_back_ms

    return _graph_back_to_back_ms(fn, layers) * 1e3


def candidate_tiles(n: int, k: int, sms: int) -> list[Tile]:
    out = []
    for bn, bk, stages in itertools.product((16, 32, 64), (64, 128, 256), (3, 4)):
        columns = triton.cdiv(n, bn)
        for split in (1, 2, 4, 8):
            if split > 1 and (columns * split > 2 * sms or k // split < bk):
                continue
            out.append(Tile(bn, bk, split, 4, stages))
    return out


def time_gemm(
    weights: list[torch.Tensor],
    x: torch.Tensor,
    out: torch.Tensor,
    part: torch.Tensor,
    add: bool,
    tile: Tile | None,
) -> float:
    """us per launch over `weights`, back to back in a graph; `tile` None times cuBLAS."""

    def run() -> None:
        for w in weights:
            if tile is not None:
                gemm(x, w, out, part, tile, Launch(), add)
            elif add:
                out.addmm_(x, w.t())
            else:
                torch.mm(x, w.t(), out=out)

    return graph_us_per_layer(run, len(weights))


def gemm_shapes(shape: str) -> list[tuple[int, int]]:
    """(N, K) of qkv, o, gate_up, down."""
    hidden, qkv_out, inter = SHAPES[shape]
    return [(qkv_out, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)]


def one_k_step_tile(tile: Tile, n: int, k: int, block_k: int, warps: int = 4) -> Tile:
    """`tile`'s columns with the whole K share in one step (K split into shares of at most `block_k`)."""
    return Tile(tile.block_n, block_k, triton.cdiv(k, block_k), warps=warps, stages=1)


def pick_tiles(shape: str, layers: list[Layer], b: Buffers, quick: bool) -> dict[str, Tile]:
    hidden, qkv_out, inter = SHAPES[shape]
    sms = torch.cuda.get_device_properties(b.x.device).multi_processor_count
    cases = {
        "qkv": ([ly.w_qkv for ly in layers], b.x, b.qkv, False),
        "o": ([ly.w_o for ly in layers], b.qkv[:, :hidden], b.x, True),
        "gate_up": ([ly.w_gu for ly in layers], b.x, b.gu, False),
        "down": ([ly.w_d for ly in layers], b.s, b.x, True),
    }
    best: dict[str, Tile] = {}
    for name, (weights, x, out, add) in cases.items():
        n, k = weights[0].shape
        cands = candidate_tiles(n, k, sms)
        if quick:
            cands = [t for t in cands if t.stages == 3 and t.block_k == 128]
        timed = sorted(((time_gemm(weights, x, out, b.part, add, t), t) for t in cands), key=lambda r: r[0])
        us, tile = timed[0]
        best[name] = tile
        print(
            f"  {name:8s} N={n:5d} K={k:5d}: cuBLAS {time_gemm(weights, x, out, b.part, add, None):6.2f} us; "
            f"best Triton {us:6.2f} us {tile} (of {len(timed)})"
        )
    return best


def probe(shape: str, batch: int, quick: bool, one_step_ks: list[int]) -> None:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    layers = make_layers(shape, LAYERS, device, gen)
    b = make_buffers(shape, batch, device, gen)
    x0 = b.x.clone()
    print(f"{shape} b={batch}, {LAYERS} layers a graph, us per layer")
    tiles = pick_tiles(shape, layers, b, quick)

    def cublas() -> None:
        for layer in layers:
            layer_cublas(layer, b)

    def ours(t: dict[str, Tile], launch: Launch) -> Callable[[], None]:
        def run() -> None:
            for layer in layers:
                layer_triton(layer, b, t, launch)

        return run

    variants: dict[str, Callable[[], None]] = {"cublas": cublas}
    runs = {
        "triton": (tiles, Launch()),
        "pdl": (tiles, Launch(pdl=True)),
        "pdl+early": (tiles, Launch(pdl=True, early=True)),
        "pdl+first": (tiles, Launch(pdl=True, preload_first=True)),
        "pdl+first+early": (tiles, Launch(pdl=True, preload_first=True, early=True)),
        "pdl+prefetch": (tiles, Launch(pdl=True, prefetch=True)),
    }
    for block_k in one_step_ks:
        one = {
            name: one_k_step_tile(t, n, k, block_k)
            for (name, t), (n, k) in zip(tiles.items(), gemm_shapes(shape))
        }
        print(f"  one K step of {block_k}: {one}")
        runs[f"{block_k}k"] = (one, Launch())
        runs[f"{block_k}k+pdl+preload"] = (one, Launch(pdl=True, preload=True))
        runs[f"{block_k}k+pdl+preload+early"] = (one, Launch(pdl=True, preload=True, early=True))
    for name, (t, launch) in runs.items():
        variants[name] = ours(t, launch)

    def replayed_once(fn: Callable[[], None]) -> torch.Tensor:
        """The whole chain from x0 as one graph replay; PDL waits in the wrong place would show here."""
        b.x.copy_(x0)
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        b.x.copy_(x0)
        graph.replay()
        torch.cuda.synchronize()
        return b.x.clone()

    baseline = replayed_once(variants["triton"])
    for name, fn in variants.items():
        note = ""
        if name != "cublas":
            err = check(shape, batch, *runs[name], device)
            got = replayed_once(fn)
            diff = (got.float() - baseline.float()).abs().max().item()
            note = (
                f", one layer max err {err:.3g}; {LAYERS}-layer replay against `triton`: max diff {diff:.3g}, "
                f"non-finite {int((~torch.isfinite(got)).sum())}"
            )
        b.x.copy_(x0)
        rounds = [graph_us_per_layer(fn, LAYERS) for _ in range(3)]
        print(f"  {name:20s} {' / '.join(f'{r:6.2f}' for r in rounds)}{note}")


def cpu_check() -> None:
    """The kernels against `layer_ref` under TRITON_INTERPRET=1 at a small shape (no PDL, no prefetch)."""
    SHAPES["tiny"] = (48, 80, 72)
    device = torch.device("cpu")
    for batch, tiles in (
        (
            5,
            {
                "qkv": Tile(16, 32, 1),
                "o": Tile(16, 16, 2),
                "gate_up": Tile(32, 32, 1),
                "down": Tile(16, 32, 3),
            },
        ),
        (
            16,
            {
                "qkv": Tile(32, 16, 3),
                "o": Tile(16, 32, 1),
                "gate_up": Tile(16, 16, 2),
                "down": Tile(32, 16, 1),
            },
        ),
    ):
        one = {
            name: one_k_step_tile(t, n, k, 32)
            for (name, t), (n, k) in zip(tiles.items(), gemm_shapes("tiny"))
        }
        for t, launch in (
            (tiles, Launch()),
            (one, Launch(preload=True)),
            (tiles, Launch(preload_first=True)),
        ):
            err32 = check("tiny", batch, t, launch, device, torch.float32)
            err16 = check("tiny", batch, t, launch, device)
            print(f"tiny b={batch} {launch}: max err fp32 {err32:.3g}, bf16 {err16:.3g}")
            assert err32 < 1e-4 and err16 < 0.25, (err32, err16)  # the interpreter truncates to bf16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64")
    parser.add_argument("--shapes", default="qwen2.5-0.5b")
    parser.add_argument("--quick", action="store_true", help="fewer tiles in the per-GEMM sweep")
    parser.add_argument("--one-step-ks", default="256,512", help="K steps for the one-step-a-program tiles")
    parser.add_argument("--check", action="store_true", help="interpreter check on the CPU, then exit")
    args = parser.parse_args()
    if args.check:
        cpu_check()
        return
    for shape in args.shapes.split(","):
        for batch in (int(x) for x in args.batches.split(",")):
            probe(shape, batch, args.quick, [int(k) for k in args.one_step_ks.split(",") if k])


if __name__ == "__main__":
    main()
