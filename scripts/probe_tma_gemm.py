"""Probe: the decode chain's skinny GEMM with its weight tiles (and optionally its activation tiles) loaded by
Hopper's tensor memory accelerator (TMA, Triton's host-side `TensorDescriptor`) instead of pointer loads
(`cp.async`). Forty sessions of tile sweeps left qwen2.5-0.5b's four decode GEMMs at ~2.6x their weight bytes at
64 rows; TMA is the one load path not yet measured. Each of a layer's linears at a decode batch, over every
layer's weights back to back in a CUDA graph (us a launch, split-K reduce included), the best tiles of each load
path against the shipped kernel's tile and cuBLAS. Checked against torch before timing. GPU (sm_90) only.
Outcome on an H100 (PERFORMANCE.md, "Fortieth session"): a no-go, within a step's spread in the engine's chain.

    python scripts/probe_tma_gemm.py --model-shape qwen2.5-0.5b --batches 64
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import torch
import triton
import triton.language as tl
from sweep_skinny_tiles import linears as sweep_linears  # scripts/ is on the path when run as a script
from triton.tools.tensor_descriptor import TensorDescriptor

from roseinfer.bench.kernels import _graph_back_to_back_ms
from roseinfer.config import ModelConfig
from roseinfer.kernels._common import num_sms
from roseinfer.kernels.skinny_gemm import (
    REDUCE_BLOCK,
    GemmTile,
    _split_sum_kernel,
    padded_rows,
    skinny_gemm,
    skinny_tile,
)
from roseinfer.models.loader import BUILTIN_CONFIG_DIR


@triton.jit
def _tma_gemm_kernel(
    x_desc,
    w_desc,
    x_ptr,
    out_ptr,
    part_ptr,
    M,
    N,
    stride_x,
    stride_o,
    k_per_split,
    K,
    ADD: tl.constexpr,
    SPLIT: tl.constexpr,
    X_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    off_n = pid_n * BLOCK_N
    k0 = pid_k * k_per_split
    offs_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, k_per_split, BLOCK_K):
        w = w_desc.load([off_n, k0 + kk])  # rows or K past the weight's edge read as 0
        if X_TMA:
            x = x_desc.load([0, k0 + kk])
        else:
            offs_k = k0 + kk + tl.arange(0, BLOCK_K)
            x = tl.load(
                x_ptr + offs_m[:, None] * stride_x + offs_k[None, :],
                mask=(offs_m[:, None] < M) & (offs_k[None, :] < K),
                other=0.0,
            )
        acc = tl.dot(x, w.T, acc)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT == 1:
        out = out_ptr + offs_m[:, None] * stride_o + offs_n[None, :]
        if ADD:
            acc += tl.load(out, mask=mask, other=0.0).to(tl.float32)
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], acc, mask=mask)


class TmaGemm:
    """One weight's TMA GEMM at one tile: descriptors built once (as the engine would at load time)."""

    def __init__(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, tile: GemmTile, x_tma: bool):
        self.x, self.w, self.out, self.tile, self.x_tma = x, w, out, tile, x_tma
        m, k = x.shape
        self.block_m = padded_rows(m)
        self.w_desc = TensorDescriptor.from_tensor(w, [tile.block_n, tile.block_k])
        self.x_desc = TensorDescriptor.from_tensor(x, [self.block_m, tile.block_k])
        self.k_per_split = triton.cdiv(triton.cdiv(k, tile.split), tile.block_k) * tile.block_k
        self.split = triton.cdiv(k, self.k_per_split)
        n = w.shape[0]
        self.part = torch.empty((self.split, m, n), dtype=torch.float32, device=x.device)

    def __call__(self, add: bool) -> None:
        (m, k), n, t = self.x.shape, self.w.shape[0], self.tile
        _tma_gemm_kernel[(triton.cdiv(n, t.block_n), self.split)](
            self.x_desc, self.w_desc, self.x, self.out, self.part, m, n, self.x.stride(0), self.out.stride(0),
            self.k_per_split, k, ADD=add, SPLIT=self.split, X_TMA=self.x_tma, BLOCK_M=self.block_m,
            BLOCK_N=t.block_n, BLOCK_K=t.block_k, num_warps=t.num_warps, num_stages=t.num_stages,
        )  # fmt: skip
        if self.split > 1:
            _split_sum_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](
                self.part, self.out, m, n, self.out.stride(0), ADD=add, SPLIT=self.split, BLOCK=REDUCE_BLOCK,
                PDL=False, num_warps=4,
            )  # fmt: skip


PATHS = {"ptr": None, "tma-w": False, "tma-wx": True}  # the load path: pointers, TMA weights, TMA both


def tiles(n: int, k: int, block_ns: list[int], block_ks: list[int], stages: list[int]) -> list[GemmTile]:
    splits = (1, 2) if n >= k else (2, 4)
    return [
        GemmTile(bn, bk, s, 4, st)
        for bn, bk, s, st in itertools.product(block_ns, block_ks, splits, stages)
        if k // s >= bk
    ]


def check(fn, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, add: bool) -> None:
    base = torch.randn_like(out)
    out.copy_(base)
    fn()
    ref = x.float() @ w.float().t() + (base.float() if add else 0)
    err = (out.float() - ref).abs().max().item()
    if err > 0.05 * ref.abs().max().item() + 0.05:
        raise AssertionError(f"wrong result: max error {err}")


def sweep_linear(
    n: int,
    k: int,
    add: bool,
    batch: int,
    layers: int,
    grid: list[list[int]],
    paths: list[str],
    gen: torch.Generator,
) -> tuple[float, float, dict[str, list[tuple[float, GemmTile]]]]:
    """(shipped us, cuBLAS us, {load path: [(us, tile)] fastest first}) for one linear at `batch` rows."""
    device = gen.device
    weights = [
        torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * 0.02 for _ in range(layers)
    ]
    x = torch.randn(batch, k, device=device, dtype=torch.bfloat16, generator=gen)
    out = torch.zeros(batch, n, device=device, dtype=torch.bfloat16)

    def time_ptr(tile: GemmTile) -> float:
        check(lambda: skinny_gemm(x, weights[0], out=out, add=add, tile=tile), x, weights[0], out, add)
        return 1e3 * _graph_back_to_back_ms(
            lambda: [skinny_gemm(x, w, out=out, add=add, tile=tile) for w in weights], len(weights)
        )

    def time_tma(tile: GemmTile, x_tma: bool) -> float:
        gemms = [TmaGemm(x, w, out, tile, x_tma) for w in weights]
        check(lambda: gemms[0](add), x, weights[0], out, add)
        return 1e3 * _graph_back_to_back_ms(lambda: [g(add) for g in gemms], len(gemms))

    def cublas() -> None:
        for w in weights:
            if add:
                out.addmm_(x, w.t())
            else:
                torch.mm(x, w.t(), out=out)

    shipped_us = time_ptr(skinny_tile(n, k, num_sms(device), padded_rows(batch)))
    cublas_us = 1e3 * _graph_back_to_back_ms(cublas, len(weights))
    results: dict[str, list[tuple[float, GemmTile]]] = {p: [] for p in paths}
    for tile in tiles(n, k, *grid):
        for label, x_tma in ((p, PATHS[p]) for p in paths):
            try:
                us = time_ptr(tile) if x_tma is None else time_tma(tile, x_tma)
            except Exception as e:  # a tile the GPU or TMA cannot take: say why, go on
                print(f"    skip {label} {tile}: {type(e).__name__}: {str(e)[:120]}")
                continue
            results[label].append((us, tile))
    for rows in results.values():
        rows.sort(key=lambda r: r[0])
    return shipped_us, cublas_us, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-shape", default="qwen2.5-0.5b")
    parser.add_argument("--batches", default="64")
    parser.add_argument("--block-n", default="16,32,64")
    parser.add_argument("--block-k", default="64,128")
    parser.add_argument("--stages", default="4,5,6")
    parser.add_argument("--only", default="", help="comma-separated linears (default: all four)")
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument(
        "--paths", default="tma-w,tma-wx", help=f"of {','.join(PATHS)} (the shipped tile always)"
    )
    args = parser.parse_args()
    grid = [[int(v) for v in a.split(",")] for a in (args.block_n, args.block_k, args.stages)]
    cfg = ModelConfig.from_path(os.path.join(BUILTIN_CONFIG_DIR, f"{args.model_shape}.json"))
    gen = torch.Generator(device=torch.device("cuda")).manual_seed(0)
    summary = []
    for batch in (int(b) for b in args.batches.split(",")):
        for name, (n, k, add) in sweep_linears(cfg).items():
            if args.only and name not in args.only.split(","):
                continue
            t0 = time.time()
            shipped_us, cublas_us, results = sweep_linear(
                n, k, add, batch, cfg.num_layers, grid, args.paths.split(","), gen
            )
            mb = n * k * 2 / 1e6
            print(
                f"b={batch} {name} N={n} K={k} ({mb:.1f} MB, {mb / 3.0:.2f} us at 3 TB/s): shipped tile "
                f"{shipped_us:.2f} us; cuBLAS {cublas_us:.2f} us  [{time.time() - t0:.0f} s]"
            )
            for label, rows in results.items():
                for us, t in rows[: args.top]:
                    print(f"    {label:8s} {us:6.2f} us ({us / shipped_us - 1:+.1%})  {t}")
                if rows:
                    summary.append((batch, name, label, rows[0][0], shipped_us, cublas_us))
    print(f"\n{args.model_shape}: batch | linear | path | best us | shipped us | cuBLAS us | best vs shipped")
    for batch, name, label, best, ship, cub in summary:
        print(f"{batch} | {name} | {label} | {best:.2f} | {ship:.2f} | {cub:.2f} | {best / ship - 1:+.1%}")


if __name__ == "__main__":
    main()
