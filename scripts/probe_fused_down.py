"""Go/no-go probe (GPU only): the MLP's second half of a decode step as one Triton launch, against what the
engine runs now.

Now: `silu_and_mul(gu, rms_of=residual)` (Triton), then `residual.addmm_(act, W_down.T)` (cuBLAS, which
at batch 64 picks a split-K GEMM plus its own reduce kernel): three launches.
Probe: one split-K GEMM whose A tiles are SiLU(gate) * up computed as they are loaded (scaled by 1 / rms of
the residual row first, as the deferred norm needs) and whose last-arriving split adds the sum of every
split's partial to the residual in a fixed order (deterministic; the ticket pattern of the decode kernel).
The rows' 1 / rms is precomputed and not timed: a first version read 64 residual rows in every program to
get it, spilled registers, and took milliseconds. A real version needs a small reduction launch for it
(~2 us, like `_rmsnorm_kernel`), which the fused time must leave room for.

Times CUDA-graph replays over 8 distinct weight sets (weights come from HBM, not L2), checks the result
against the torch reference, and prints us per layer for each tile config and the engine's path.
Not wired into the engine: this decides whether it is worth doing.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

from roseinfer.bench.kernels import _graph_median_ms
from roseinfer.kernels.activation import silu_and_mul, silu_and_mul_ref

LAYERS = 8
SHAPES = {"qwen2.5-0.5b": (896, 4864), "llama-3.1-8b": (4096, 14336)}  # (hidden, intermediate)


@triton.jit
def _silu_down_kernel(
    gu_ptr,
    w_ptr,
    res_ptr,
    out_ptr,
    part_ptr,
    counters_ptr,
    inv_rms_ptr,
    M,
    N,
    inter,
    stride_gu,
    stride_w,
    stride_res,
    K_PER_SPLIT: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    m_mask = rm < M
    n_mask = rn < N
    # 1 / rms of each residual row (the deferred MLP norm), computed by an earlier launch: reading 64 rows
    # of the residual in every program spilled registers and cost milliseconds.
    inv = tl.load(inv_rms_ptr + rm, mask=m_mask, other=0.0)[:, None]
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    k_lo = pid_k * K_PER_SPLIT
    for k0 in range(k_lo, k_lo + K_PER_SPLIT, BK):
        rk = k0 + tl.arange(0, BK)
        k_mask = rk < inter
        a_mask = m_mask[:, None] & k_mask[None, :]
        g = tl.load(gu_ptr + rm[:, None] * stride_gu + rk[None, :], mask=a_mask, other=0.0)
        u = tl.load(gu_ptr + rm[:, None] * stride_gu + inter + rk[None, :], mask=a_mask, other=0.0)
        g = (g.to(tl.float32) * inv).to(gu_ptr.dtype.element_ty).to(tl.float32)
        u = (u.to(tl.float32) * inv).to(gu_ptr.dtype.element_ty)
        act = (g / (1.0 + tl.exp(-g))).to(gu_ptr.dtype.element_ty)
        a = (act.to(tl.float32) * u.to(tl.float32)).to(gu_ptr.dtype.element_ty)
        w = tl.load(
            w_ptr + rn[None, :] * stride_w + rk[:, None], mask=n_mask[None, :] & k_mask[:, None], other=0.0
        )
        acc = tl.dot(a, w, acc)
    # The sum goes to another tensor: other programs may still be reading these residual rows for their rms.
    res_ptrs = res_ptr + rm[:, None] * stride_res + rn[None, :]
    out_ptrs = out_ptr + rm[:, None] * stride_res + rn[None, :]
    o_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        res = tl.load(res_ptrs, mask=o_mask, other=0.0).to(tl.float32)
        tl.store(out_ptrs, (res + acc).to(res_ptr.dtype.element_ty), mask=o_mask)
    else:
        tile = rm[:, None] * N + rn[None, :]
        tl.store(part_ptr + pid_k * M * N + tile, acc, mask=o_mask)
        tl.debug_barrier()
        counter = counters_ptr + pid_m * tl.num_programs(0) + pid_n
        ticket = tl.atomic_add(counter, 1)
        if ticket == SPLIT_K - 1:
            total = tl.zeros([BM, BN], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                total += tl.load(part_ptr + s * M * N + tile, mask=o_mask, other=0.0, cache_modifier=".cg")
            res = tl.load(res_ptrs, mask=o_mask, other=0.0).to(tl.float32)
            tl.store(out_ptrs, (res + total).to(res_ptr.dtype.element_ty), mask=o_mask)
            tl.atomic_xchg(counter, 0)


def silu_down(
    gu: torch.Tensor,
    w: torch.Tensor,
    residual: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    cfg: tuple,
    scratch: dict,
) -> None:
    """out = residual + silu_and_mul(gu, rms_of=residual) @ w.T (out must not alias residual). The rows'
    1 / rms comes from an earlier reduction (cached in `scratch`, so the probe times the GEMM alone)."""
    if "inv_rms" not in scratch:
        scratch["inv_rms"] = torch.rsqrt(residual.float().pow(2).mean(-1) + eps)
    inv_rms = scratch["inv_rms"]
    bn, bk, split, warps, stages = cfg
    m, n, inter = gu.shape[0], w.shape[0], w.shape[1]
    bm = max(16, triton.next_power_of_2(m))
    k_per_split = triton.cdiv(triton.cdiv(inter, split), bk) * bk
    grid = (triton.cdiv(n, bn), split, triton.cdiv(m, bm))
    if "part" not in scratch:
        scratch["part"] = torch.empty((split, m, n), dtype=torch.float32, device=gu.device)
        scratch["counters"] = torch.zeros(grid[0] * grid[2], dtype=torch.int32, device=gu.device)
    _silu_down_kernel[grid](
        gu, w, residual, out, scratch["part"], scratch["counters"], inv_rms, m, n, inter,
        gu.stride(0), w.stride(0), residual.stride(0),
        K_PER_SPLIT=k_per_split, SPLIT_K=split, BM=bm, BN=bn, BK=bk,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip


def graph_us(fn) -> float:
    return _graph_median_ms(fn) * 1e3 / LAYERS


def probe(shape: str, batch: int, configs: list[tuple], gen: torch.Generator) -> None:
    hidden, inter = SHAPES[shape]
    dev, dt, eps = gen.device, torch.bfloat16, 1e-6
    ws = [
        torch.randn(hidden, inter, device=dev, dtype=dt, generator=gen) * inter**-0.5 for _ in range(LAYERS)
    ]
    gu = torch.randn(batch, 2 * inter, device=dev, dtype=dt, generator=gen) * 4
    base = torch.randn(batch, hidden, device=dev, dtype=dt, generator=gen)
    residual = base.clone()
    out = torch.empty_like(base)

    def engine() -> None:
        for w in ws:
            residual.addmm_(silu_and_mul(gu, rms_of=residual, eps=eps), w.t())

    print(f"{shape} b={batch}: engine (silu_and_mul + cuBLAS addmm_) {graph_us(engine):.2f} us/layer")
    expect = (base.float() + silu_and_mul_ref(gu, base, eps).float() @ ws[0].float().t()).to(dt)
    for cfg in configs:
        scratch: dict = {}
        try:
            silu_down(gu, ws[0], base, out, eps, cfg, scratch)
        except Exception as exc:  # a tile that does not fit
            print(f"  {cfg}: {type(exc).__name__}")
            continue
        err = (out.float() - expect.float()).abs().max().item()

        def fused(s=scratch, c=cfg) -> None:
            for w in ws:
                silu_down(gu, w, base, out, eps, c, s)

        print(
            f"  fused (BN, BK, split, warps, stages) {cfg}: {graph_us(fused):.2f} us/layer, max err {err:.3g}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args()
    configs = list(itertools.product((32, 64), (64,), (4, 8), (4, 8), (3,)))
    gen = torch.Generator(device=torch.device("cuda")).manual_seed(0)
    for shape in args.shapes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            probe(shape, batch, configs, gen)


if __name__ == "__main__":
    main()
