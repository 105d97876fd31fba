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
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from roseinfer.kernels._common import dot_dtype  # also lets the interpreter run loops under numpy >= 2.4

LAYERS = 24
SHAPES = {
    "qwen2.5-0.5b": (896, 1152, 4864),
    "qwen3-0.6b": (1024, 4096, 3072),
}  # hidden, qkv out, intermediate
BULK_PREFETCH = tl.constexpr(
    "{ .reg .pred p; setp.gt.u32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }"
)


@triton.jit
def _let_dependents_go(PDL: tl.constexpr, EARLY: tl.constexpr, AT_START: tl.constexpr):
    """Under PDL the next kernel may launch once every program of this one has called this (or exited):
    at the start with EARLY, else once past the wait (`_wait_for_predecessor`)."""
    if PDL:
        if EARLY == AT_START:
            gdc_launch_dependents()


@triton.jit
def _wait_for_predecessor(PDL: tl.constexpr, EARLY: tl.constexpr):
    """Under PDL: block until the previous kernel has finished and its writes are visible."""
    if PDL:
        gdc_wait()
        _let_dependents_go(PDL, EARLY, False)


@triton.jit
def _gemm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    part_ptr,
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_o,
    k_per_split,
    ADD: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    PRE: tl.constexpr,
    EARLY: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """out (+)= x @ w.T for one BLOCK_N column tile and one K share; with SPLIT > 1 the fp32 partial goes to
    part[pid_k] and `_reduce_kernel` finishes it."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    k0 = pid_k * k_per_split
    _let_dependents_go(PDL, EARLY, True)
    if PRE == 1:
        rows = w_ptr.to(tl.pointer_type(tl.uint8)) + (offs_n.to(tl.int64) * stride_w + k0) * 2
        size = tl.where(offs_n < N, (tl.minimum(k0 + k_per_split, K) - k0) * 2, 0).to(tl.int32)
        tl.inline_asm_elementwise(
            BULK_PREFETCH, "=r,l,r", [rows, size], dtype=tl.int32, is_pure=False, pack=1
        )
    if PRE >= 2:  # the first K step's weights before waiting on the predecessor (2: the only step)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w_tile = tl.load(
            w_ptr + offs_n[None, :].to(tl.int64) * stride_w + offs_k[:, None],
            mask=(offs_n[None, :] < N) & (offs_k[:, None] < K),
            other=0.0,
        )
    _wait_for_predecessor(PDL, EARLY)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PRE >= 2:
        xa = tl.load(
            x_ptr + offs_m[:, None] * stride_x + offs_k[None, :],
            mask=(offs_m[:, None] < M) & (offs_k[None, :] < K),
            other=0.0,
        )
        acc = tl.dot(xa.to(DOT_DTYPE), w_tile.to(DOT_DTYPE), acc)
    if PRE != 2:
        for kk in range(
            BLOCK_K if PRE == 3 else 0, k_per_split, BLOCK_K
        ):  # k_per_split: a multiple of BLOCK_K
            offs_k = k0 + kk + tl.arange(0, BLOCK_K)
            xa = tl.load(
                x_ptr + offs_m[:, None] * stride_x + offs_k[None, :],
                mask=(offs_m[:, None] < M) & (offs_k[None, :] < K),
                other=0.0,
            )
            wb = tl.load(
                w_ptr + offs_n[None, :].to(tl.int64) * stride_w + offs_k[:, None],
                mask=(offs_n[None, :] < N) & (offs_k[:, None] < K),
                other=0.0,
            )
            acc = tl.dot(xa.to(DOT_DTYPE), wb.to(DOT_DTYPE), acc)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT == 1:
        out = out_ptr + offs_m[:, None] * stride_o + offs_n[None, :]
        if ADD:
            acc += tl.load(out, mask=mask, other=0.0).to(tl.float32)
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], acc, mask=mask)


@triton.jit
def _reduce_kernel(
    part_ptr,
    out_ptr,
    M,
    N,
    stride_o,
    ADD: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
    EARLY: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    _let_dependents_go(PDL, EARLY, True)
    _wait_for_predecessor(PDL, EARLY)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0)
    out = out_ptr + (offs // N) * stride_o + offs % N
    if ADD:
        acc += tl.load(out, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(
    g_ptr, s_ptr, inter, stride_g, stride_s, BLOCK: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    _let_dependents_go(PDL, EARLY, True)
    _wait_for_predecessor(PDL, EARLY)
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(g_ptr + row * stride_g + inter + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(s_ptr + row * stride_s + cols, (g * tl.sigmoid(g) * u).to(s_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class Tile:
    block_n: int
    block_k: int
    split: int
    warps: int = 4
    stages: int = 3


@dataclass(frozen=True)
class Launch:
    pdl: bool = False
    prefetch: bool = False
    preload: bool = False  # needs a tile with one K step a program
    preload_first: bool = False  # the first K step only
    early: bool = False


def _pdl_kwargs(launch: Launch) -> dict[str, bool]:
    return {"launch_pdl": True} if launch.pdl else {}


def gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    part: torch.Tensor,
    tile: Tile,
    launch: Launch,
    add: bool,
) -> None:
    """out (+)= x @ w.T; `part` is an fp32 workspace of at least split * M * N."""
    m, k = x.shape
    n = w.shape[0]
    k_per_split = triton.cdiv(triton.cdiv(k, tile.split), tile.block_k) * tile.block_k
    if launch.preload and k_per_split != tile.block_k:
        raise ValueError(f"preload needs one K step a program: {tile} at K={k}")
    grid = (triton.cdiv(n, tile.block_n), tile.split)
    _gemm_kernel[grid](
        x, w, out, part, m, n, k, x.stride(0), w.stride(0), out.stride(0), k_per_split,
        ADD=add, SPLIT=tile.split, BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, PDL=launch.pdl, PRE=2 if launch.preload else 3 if launch.preload_first else int(launch.prefetch), EARLY=launch.early,
        DOT_DTYPE=dot_dtype(x.dtype),
        num_warps=tile.warps, num_stages=tile.stages, **_pdl_kwargs(launch),
    )  # fmt: skip
    if tile.split > 1:
        block = 1024
        _reduce_kernel[(triton.cdiv(m * n, block),)](
            part, out, m, n, out.stride(0), ADD=add, SPLIT=tile.split, BLOCK=block, PDL=launch.pdl,
            EARLY=launch.early, num_warps=4, **_pdl_kwargs(launch),
        )  # fmt: skip


def silu_mul(gu: torch.Tensor, s: torch.Tensor, launch: Launch) -> None:
    m, inter = s.shape
    block = 1024
    _silu_mul_kernel[(m, triton.cdiv(inter, block))](
        gu, s, inter, gu.stride(0), s.stride(0), BLOCK=block, PDL=launch.pdl, EARLY=launch.early, num_warps=4,
        **_pdl_kwargs(launch),
    )  # fmt: skip


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
