"""Probe (GPU only; no-go on the H100, PERFORMANCE.md eleventh session): a decode step's MLP as one
persistent launch, `residual += down(silu(gate) * up)` with `[gate | up] = norm(residual) @ W_gu.T` (norm weight
folded into W_gu), against the engine's cuBLAS gate_up, `silu_and_mul` with the deferred norm, and cuBLAS
`addmm_` down with its split-K reduce.

The kernel runs one program per SM:
- phase 1: an equal share of the intermediate columns per program, gate and up for every row (1 / rms
  gathered over the same K loop), `silu(gate) * up` written to a workspace;
- a grid barrier (one program per SM, so all are resident);
- phase 2: the down GEMM as (column tile, K share) tasks; the last task of a tile adds every share's fp32
  partial, in a fixed order, to the residual.
Under the Triton interpreter programs run one after another, so the phases run as two launches there
(`split_phases`).

Times CUDA-graph replays over LAYERS distinct weight sets, checks against `fused_mlp_ref`, and prints us per
layer: the engine, the fused launch per tile config, and the phases as two launches (the difference is the
grid barrier against a launch boundary). `--stress N` checks N launches of each against the reference.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from roseinfer.bench.kernels import _graph_median_ms
from roseinfer.kernels._common import dot_dtype, dot_precision, is_interpret, num_sms
from roseinfer.kernels.activation import silu_and_mul

BOTH_PHASES, GATE_UP_PHASE, DOWN_PHASE = 0, 1, 2


@triton.jit
def _fused_mlp_kernel(
    x_ptr,
    wgu_ptr,
    wd_ptr,
    h_ptr,
    part_ptr,
    tickets_ptr,
    barrier_ptr,
    M,
    H,
    INTER,
    stride_x,
    stride_wgu,
    stride_wd,
    stride_h,
    cols_per_program,
    k_per_split,
    eps,
    BLOCK_M: tl.constexpr,
    BN1: tl.constexpr,
    BK1: tl.constexpr,
    BN2: tl.constexpr,
    BK2: tl.constexpr,
    SPLITS: tl.constexpr,
    PHASE: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    rows = tl.arange(0, BLOCK_M)
    row_mask = rows < M
    out_dtype = x_ptr.dtype.element_ty

    if PHASE != 2:
        c_lo = pid * cols_per_program
        c_hi = tl.minimum(c_lo + cols_per_program, INTER)
        for n0 in range(c_lo, c_hi, BN1):
            n = n0 + tl.arange(0, BN1)
            n_mask = n < c_hi
            acc_g = tl.zeros([BLOCK_M, BN1], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_M, BN1], dtype=tl.float32)
            sq = tl.zeros([BLOCK_M], dtype=tl.float32)
            for k0 in range(0, H, BK1):
                k = k0 + tl.arange(0, BK1)
                k_mask = k < H
                x = tl.load(
                    x_ptr + rows[:, None] * stride_x + k[None, :],
                    mask=row_mask[:, None] & k_mask[None, :],
                    other=0.0,
                )
                xf = x.to(tl.float32)
                sq += tl.sum(xf * xf, axis=1)
                w_mask = n_mask[:, None] & k_mask[None, :]
                wg = tl.load(wgu_ptr + n[:, None] * stride_wgu + k[None, :], mask=w_mask, other=0.0)
                wu = tl.load(wgu_ptr + (INTER + n)[:, None] * stride_wgu + k[None, :], mask=w_mask, other=0.0)
                xd = x.to(DOT_DTYPE)
                acc_g = tl.dot(xd, tl.trans(wg.to(DOT_DTYPE)), acc_g, input_precision=PRECISION)
                acc_u = tl.dot(xd, tl.trans(wu.to(DOT_DTYPE)), acc_u, input_precision=PRECISION)
            inv_rms = tl.rsqrt(sq / H + eps)[:, None]
            # Rounded where the unfused path rounds: the projection's output, SiLU's output, the product.
            gate = (acc_g * inv_rms).to(out_dtype).to(tl.float32)
            up = (acc_u * inv_rms).to(out_dtype).to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(out_dtype).to(tl.float32)
            tl.store(
                h_ptr + rows[:, None] * stride_h + n[None, :],
                (act * up).to(out_dtype),
                mask=row_mask[:, None] & n_mask[None, :],
            )

    if PHASE == 0:
        # Grid barrier on a counter that only grows (int64): arrivals of one launch take the tickets
        # [j * programs, (j + 1) * programs). The CTA barrier orders every thread's stores before the
        # (acq_rel, gpu-scope) ticket; the acquire loads order the phase-2 loads after every arrival.
        tl.debug_barrier()
        ticket = tl.atomic_add(barrier_ptr, 1)
        target = (ticket // programs + 1) * programs
        seen = tl.atomic_add(barrier_ptr, 0, sem="acquire")
        while seen < target:
            seen = tl.atomic_add(barrier_ptr, 0, sem="acquire")

    if PHASE != 1:
        n_tiles = tl.cdiv(H, BN2)
        for task in range(pid, n_tiles * SPLITS, programs):
            tile = task // SPLITS
            share = task % SPLITS
            n = tile * BN2 + tl.arange(0, BN2)
            n_mask = n < H
            k_lo = share * k_per_split
            k_hi = tl.minimum(k_lo + k_per_split, INTER)
            acc = tl.zeros([BLOCK_M, BN2], dtype=tl.float32)
            for k0 in range(k_lo, k_hi, BK2):
                k = k0 + tl.arange(0, BK2)
                k_mask = k < k_hi
                a = tl.load(
                    h_ptr + rows[:, None] * stride_h + k[None, :],
                    mask=row_mask[:, None] & k_mask[None, :],
                    other=0.0,
                    cache_modifier=".cg",  # written by other programs in phase 1: not from L1
                )
                w = tl.load(
                    wd_ptr + n[:, None] * stride_wd + k[None, :],
                    mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0,
                )
                acc = tl.dot(a.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), acc, input_precision=PRECISION)
            o_mask = row_mask[:, None] & n_mask[None, :]
            part_tile = rows[:, None] * H + n[None, :]
            tl.store(part_ptr + share * BLOCK_M * H + part_tile, acc, mask=o_mask)
            tl.debug_barrier()
            counter = tickets_ptr + tile
            if tl.atomic_add(counter, 1) == SPLITS - 1:
                total = tl.zeros([BLOCK_M, BN2], dtype=tl.float32)
                for s in tl.static_range(SPLITS):
                    total += tl.load(
                        part_ptr + s * BLOCK_M * H + part_tile, mask=o_mask, other=0.0, cache_modifier=".cg"
                    )
                res_ptrs = x_ptr + rows[:, None] * stride_x + n[None, :]
                res = tl.load(res_ptrs, mask=o_mask, other=0.0).to(tl.float32)
                tl.store(res_ptrs, (res + total).to(out_dtype), mask=o_mask)
                tl.atomic_xchg(counter, 0)  # ready for the next launch


@dataclass(frozen=True)
class MLPLaunch:
    """How the work is cut for one (batch, hidden, intermediate) shape and program count."""

    programs: int
    block_m: int
    cols_per_program: int
    bn1: int
    bk1: int
    bn2: int
    bk2: int
    splits: int
    k_per_split: int
    num_warps: int
    num_stages: int


MAX_ROWS = 64


def plan_launch(
    rows: int,
    hidden: int,
    inter: int,
    programs: int,
    bk1: int | None = None,
    bn2: int | None = None,
    bk2: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> MLPLaunch:
    """Every phase-1 program gets ceil(inter / programs) columns (one tile of BN1 >= that, masked), and
    phase 2 gets as many K shares per column tile as the programs allow (each share a multiple of BK2)."""
    block_m = max(16, triton.next_power_of_2(rows))
    cols = triton.cdiv(inter, programs)
    bn1 = min(128, max(16, triton.next_power_of_2(cols)))
    bk1 = bk1 or (64 if hidden >= 2048 else 128)
    bn2 = bn2 or 64
    bk2 = bk2 or 64
    n_tiles = triton.cdiv(hidden, bn2)
    k_blocks = triton.cdiv(inter, bk2)
    splits = max(1, min(programs // n_tiles, k_blocks)) if programs >= n_tiles else 1
    k_per_split = triton.cdiv(k_blocks, splits) * bk2
    splits = triton.cdiv(inter, k_per_split)  # no empty share
    warps = num_warps or (8 if block_m * bn1 > 64 * 64 else 4)
    return MLPLaunch(programs, block_m, cols, bn1, bk1, bn2, bk2, splits, k_per_split, warps, num_stages or 3)


_WORKSPACE: dict[str, torch.Tensor] = {}


def _workspace(name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Scratch shared by every launch (one device): zeroed once, grown only by an eager call (the probe
    runs each size eagerly before capturing it)."""
    buf = _WORKSPACE.get(name)
    if buf is None or buf.numel() < numel or buf.dtype != dtype:
        buf = _WORKSPACE[name] = torch.zeros(numel, dtype=dtype, device=device)
    return buf[:numel]


def fused_mlp_(
    residual: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    eps: float,
    plan: MLPLaunch | None = None,
    split_phases: bool | None = None,
) -> torch.Tensor:
    """`residual += silu(g) * u @ w_down.T` in place, with `[g | u] = (residual @ w_gate_up.T) / rms(residual)`.

    residual [M, H] (M <= MAX_ROWS), w_gate_up [2I, H], w_down [H, I], all of one dtype with contiguous
    rows. `split_phases` runs the phases as two launches (the default under the interpreter)."""
    m, hidden = residual.shape
    inter = w_down.shape[1]
    assert w_gate_up.shape == (2 * inter, hidden) and 0 < m <= MAX_ROWS, "the probe's own shapes"
    if split_phases is None:
        split_phases = is_interpret()
    if plan is None:
        plan = plan_launch(m, hidden, inter, 1 if is_interpret() else num_sms(residual.device))
    for phase in (GATE_UP_PHASE, DOWN_PHASE) if split_phases else (BOTH_PHASES,):
        launch_phase(residual, w_gate_up, w_down, eps, plan, phase)
    return residual


def launch_phase(
    residual: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    eps: float,
    plan: MLPLaunch,
    phase: int,
) -> None:
    """One launch of `phase` (BOTH_PHASES, GATE_UP_PHASE or DOWN_PHASE); arguments checked by `fused_mlp_`."""
    m, hidden = residual.shape
    inter = w_down.shape[1]
    dev = residual.device
    h = _workspace("h", m * inter, residual.dtype, dev).view(m, inter)
    part = _workspace("part", plan.splits * plan.block_m * hidden, torch.float32, dev)
    tickets = _workspace("tickets", triton.cdiv(hidden, plan.bn2), torch.int32, dev)
    barrier = _workspace("barrier", 1, torch.int64, dev)
    _fused_mlp_kernel[(plan.programs,)](
        residual, w_gate_up, w_down, h, part, tickets, barrier, m, hidden, inter,
        residual.stride(0), w_gate_up.stride(0), w_down.stride(0), h.stride(0),
        plan.cols_per_program, plan.k_per_split, eps,
        BLOCK_M=plan.block_m,
        BN1=plan.bn1,
        BK1=plan.bk1,
        BN2=plan.bn2,
        BK2=plan.bk2,
        SPLITS=plan.splits,
        PHASE=phase,
        PRECISION=dot_precision(residual.dtype),
        DOT_DTYPE=dot_dtype(residual.dtype),
        num_warps=plan.num_warps,
        num_stages=plan.num_stages,
    )  # fmt: skip


def fused_mlp_ref(
    residual: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, eps: float
) -> torch.Tensor:
    """What `fused_mlp_` leaves in `residual` (returned as a new tensor; `residual` is not changed)."""
    xf = residual.float()
    inv_rms = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    gate_up = ((xf @ w_gate_up.float().t()) * inv_rms).to(residual.dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    act = F.silu(gate.float()).to(residual.dtype).float() * up.float()
    return (xf + act.to(residual.dtype).float() @ w_down.float().t()).to(residual.dtype)


LAYERS = 24
SHAPES = {"qwen2.5-0.5b": (896, 4864), "llama-3.1-8b": (4096, 14336)}  # (hidden, intermediate)


def graph_us(fn) -> float:  # type: ignore[no-untyped-def]
    return _graph_median_ms(fn) * 1e3 / LAYERS


def probe(shape: str, batch: int, sweep: bool, stress: int, gen: torch.Generator) -> None:
    hidden, inter = SHAPES[shape]
    dev, dt, eps = gen.device, torch.bfloat16, 1e-6
    layers = LAYERS if hidden < 2048 else 8
    w_gu = [
        torch.randn(2 * inter, hidden, device=dev, generator=gen).to(dt) * hidden**-0.5 for _ in range(layers)
    ]
    w_d = [torch.randn(hidden, inter, device=dev, generator=gen).to(dt) * inter**-0.5 for _ in range(layers)]
    base = torch.randn(batch, hidden, device=dev, generator=gen).to(dt)
    expect = fused_mlp_ref(base, w_gu[0], w_d[0], eps)
    residual = base.clone()

    def engine() -> None:
        for i in range(LAYERS):
            gate_up = torch.mm(residual, w_gu[i % layers].t())
            residual.addmm_(silu_and_mul(gate_up, rms_of=residual, eps=eps), w_d[i % layers].t())

    out = base.clone()
    engine_once = out.addmm_(silu_and_mul(torch.mm(out, w_gu[0].t()), rms_of=out, eps=eps), w_d[0].t())
    err_engine = (engine_once.float() - expect.float()).abs().max().item()
    print(
        f"{shape} b={batch}: engine (mm + silu_and_mul + addmm_) {graph_us(engine):.2f} us/layer, max err {err_engine:.3g}"
    )

    programs = num_sms(dev)
    plans = [plan_launch(batch, hidden, inter, programs)]
    if sweep:
        for bk1, bn2, bk2, warps, stages in itertools.product(
            (128, 256), (32, 64), (64, 128, 256), (4, 8), (3, 4)
        ):
            plans.append(plan_launch(batch, hidden, inter, programs, bk1, bn2, bk2, warps, stages))
    results = []
    for plan in plans:
        out = base.clone()
        try:
            fused_mlp_(out, w_gu[0], w_d[0], eps, plan=plan, split_phases=False)
        except Exception as exc:  # a tile that does not fit
            print(f"  {plan}: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        torch.cuda.synchronize()
        err = (out.float() - expect.float()).abs().max().item()

        def fused(p=plan) -> None:  # type: ignore[no-untyped-def]
            for i in range(LAYERS):
                fused_mlp_(residual, w_gu[i % layers], w_d[i % layers], eps, plan=p, split_phases=False)

        results.append((graph_us(fused), err, plan))
    results.sort(key=lambda r: r[0])
    for us, err, plan in results[:6] if sweep else results:
        p = plan
        print(
            f"  fused (bk1 {p.bk1}, bn2 {p.bn2}, bk2 {p.bk2}, splits {p.splits}, warps {p.num_warps}, "
            f"stages {p.num_stages}): {us:.2f} us/layer, max err {err:.3g}"
        )
    best = results[0][2]
    if stress:
        for plan in (best, plans[0]):
            for split in (False, True):
                bad, worst = 0, 0.0
                for _ in range(stress):
                    out = base.clone()
                    fused_mlp_(out, w_gu[0], w_d[0], eps, plan=plan, split_phases=split)
                    err = (out.float() - expect.float()).abs().max().item()
                    bad += err > 0.1
                    worst = max(worst, err)
                print(
                    f"  stress {plan} split_phases={split}: {bad}/{stress} launches off by > 0.1, worst {worst:.3g}"
                )

    def phase(ph: int):  # type: ignore[no-untyped-def]
        def run() -> None:
            for i in range(LAYERS):
                launch_phase(residual, w_gu[i % layers], w_d[i % layers], eps, best, ph)

        return run

    one, two = phase(GATE_UP_PHASE), phase(DOWN_PHASE)
    print(
        f"  best as two launches: gate_up {graph_us(one):.2f} + down {graph_us(two):.2f} us/layer; "
        f"both {graph_us(lambda: (one(), two())):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--sweep", action="store_true", help="sweep tile configs (slow: compiles each)")
    parser.add_argument(
        "--stress", type=int, default=0, help="check this many launches each against the reference"
    )
    args = parser.parse_args()
    gen = torch.Generator(device=torch.device("cuda")).manual_seed(0)
    for shape in args.shapes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            probe(shape, batch, args.sweep, args.stress, gen)


if __name__ == "__main__":
    main()
