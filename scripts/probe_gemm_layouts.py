"""Probe (GPU only): do the decode linears run faster with another weight layout or BLAS library?

cuBLAS picks its kernel from the problem's layout as well as its shape. The engine keeps HF's [N, K] weights
and calls `torch.mm(x, W.t())` (and `residual.addmm_(x, W.t())` for o and down). This times, at decode batch
sizes, each linear of a model shape as
- `mm(x, W.t())`, W [N, K] (the engine now);
- `mm(x, Wt)`, Wt [K, N] contiguous (weights stored transposed);
- `mm(W, x.t())` (the swapped product, out [N, M]: for reference only, the engine cannot take it as is);
- for o and down, `residual.addmm_` with each layout,
under torch's default BLAS library and under cuBLASLt. CUDA-graph replays over distinct weight sets (weights
come from HBM, as in a step); us per call and the weight's read rate.
"""

from __future__ import annotations

import argparse

import torch

from roseinfer.bench.kernels import _graph_median_ms

SHAPES = {  # linear -> (N, K)
    "qwen2.5-0.5b": {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864)},
    "llama-3.1-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)},
}
ADDS = ("o", "down")


def weight_sets(n: int, k: int) -> int:
    return max(2, min(24, (1 << 30) // (n * k * 2)))


def time_us(fn, calls: int) -> float:  # type: ignore[no-untyped-def]
    return _graph_median_ms(fn) * 1e3 / calls


def probe(shape: str, batch: int, gen: torch.Generator) -> None:
    for name, (n, k) in SHAPES[shape].items():
        probe_linear(shape, batch, name, n, k, gen)


def probe_linear(shape: str, batch: int, name: str, n: int, k: int, gen: torch.Generator) -> None:
    dev, dt = gen.device, torch.bfloat16
    sets = weight_sets(n, k)
    ws = [torch.randn(n, k, device=dev, generator=gen).to(dt) for _ in range(sets)]
    wts = [w.t().contiguous() for w in ws]
    x = torch.randn(batch, k, device=dev, generator=gen).to(dt)
    r = torch.randn(batch, n, device=dev, generator=gen).to(dt)
    assert torch.allclose(torch.mm(x, ws[0].t()).float(), torch.mm(x, wts[0]).float(), atol=1e-1, rtol=2e-2)
    variants = {
        "mm(x, W.t())": lambda: [torch.mm(x, w.t()) for w in ws],
        "mm(x, Wt)": lambda: [torch.mm(x, w) for w in wts],
        "mm(W, x.t())": lambda: [torch.mm(w, x.t()) for w in ws],
    }
    if name in ADDS:
        variants["addmm_(x, W.t())"] = lambda: [r.addmm_(x, w.t()) for w in ws]
        variants["addmm_(x, Wt)"] = lambda: [r.addmm_(x, w) for w in wts]
    mb = n * k * 2 / 1e6
    cells = []
    for lib in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        for label, fn in variants.items():
            us = time_us(fn, sets)
            cells.append(f"{lib}:{label} {us:.2f} us ({mb / us:.2f} TB/s)")
    torch.backends.cuda.preferred_blas_library("cublas")
    print(f"{shape} b={batch} {name} [{n}x{k}, {mb:.1f} MB]:")
    for c in cells:
        print(f"    {c}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args()
    gen = torch.Generator(device=torch.device("cuda")).manual_seed(0)
    for shape in args.shapes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            probe(shape, batch, gen)


if __name__ == "__main__":
    main()
