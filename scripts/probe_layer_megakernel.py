"""Probe (GPU for timings; `--check` runs under the Triton interpreter): every layer's GEMM chain of a small
model's decode step in ONE launch, with dependencies per tile instead of kernel boundaries.

The chain is `probe_pdl_chain.py`'s (attention left out):

    qkv = x @ Wqkv.T;  x += qkv[:, :H] @ Wo.T;  s = silu(x @ Wg.T) * (x @ Wu.T);  x += s @ Wd.T

The eleventh, seventeenth and nineteenth sessions found each launch's ramp and tail (~3-4 us) to be most of a
qwen2.5-0.5b decode layer, and said only a kernel whose phases overlap, with dependencies per tile, could
close that gap. This is that kernel, for the GEMMs:

- The work is a list of tasks in dependency order: for each layer the qkv tiles, then o, then gate_up, then
  down. A task is one BLOCK_N column tile of one GEMM over one share of K.
- `programs_per_sm` programs per SM each take the next task from a queue (an atomic counter), so a task only
  ever waits on tasks taken before it: that cannot deadlock, and under the interpreter (programs run one after
  another) the first program simply does every task in order.
- A task first waits (acquire atomics) on a counter of the tasks it reads from: qkv on the previous layer's
  down tiles, o on this layer's qkv tiles, gate_up on o's, and each down share only on the gate_up tiles that
  write its share of `s`. So down starts while gate_up is still running, and every phase's first tasks start
  as the last ones of the phase before drain, not after a launch boundary.
- Split-K partials are summed, in share order (deterministic), by the last share of a tile to finish.
- gate_up's weights are interleaved per tile (BLOCK_N / 2 gate rows, then the same up rows), so its epilogue
  writes `silu(g) * u` and there is no SiLU launch.
- x is two buffers: o reads x_a and writes x_b = x_a + o, down writes x_a = x_b + down, so a down tile never
  writes rows a gate_up tile of the same layer may still read.

Prints us per layer for the engine's chain (skinny Triton GEMMs with PDL, the tiles `skinny_tile` picks) and
for the megakernel at each config, with each one's 24-layer result against an fp32 reference and whether five
launches agree bit for bit. `--trace` adds one launch's timeline per phase (%globaltimer stamps per task).

Result (H100, twenty-first session, PERFORMANCE.md): correct and deterministic, and a dependency is seen
~0.25 us after it is met, but slower than the engine's PDL chain at every batch: at best (a tile per GEMM,
16/32/64/32 columns) b=64 28.9 against 26.0 us a layer, b=16 26.6 against 24.1. qkv -> o -> gate_up are
all-to-all dependencies (every tile reads the whole row), so those phases still run one after another, and
gate_up + down stream more slowly in one kernel than as tuned separate launches.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass

import numpy as np
import torch
import triton
from megakernel_chain_kernels import ADD, DOWN, FIELDS, GATE_UP, O_PROJ, QKV, SILU, STORE, chain_kernel
from pdl_chain_kernels import Launch, Tile
from probe_pdl_chain import (
    SHAPES,
    Buffers,
    Layer,
    graph_us_per_layer,
    layer_ref,
    layer_triton,
    make_buffers,
    make_layers,
)

from roseinfer.kernels._common import dot_dtype, dot_precision, is_interpret, num_sms


@dataclass(frozen=True)
class Config:
    block_n: tuple[int, int, int, int] = (32, 32, 32, 32)  # column tile of qkv, o, gate_up, down
    block_k: int = 128
    splits: tuple[int, int, int, int] = (2, 2, 1, 8)  # qkv, o, gate_up, down
    programs_per_sm: int = 2
    warps: int = 4
    stages: int = 3
    preload: bool = False
    claim_ahead: bool = False
    backoff_ns: int = 0

    def __str__(self) -> str:
        s = "/".join(map(str, self.splits))
        pre = " pre" if self.preload else ""
        ahead = (" ahead" if self.claim_ahead else "") + (
            f" sleep{self.backoff_ns}" if self.backoff_ns else ""
        )
        return (
            f"bn{'/'.join(map(str, self.block_n))} bk{self.block_k} S{s} p{self.programs_per_sm} w{self.warps} st{self.stages}"
            f"{pre}{ahead}"
        )


@dataclass
class Plan:
    """Everything one launch needs: arenas, the task list, the counters."""

    act: torch.Tensor  # bf16: x_a [M, H], x_b [M, H], qkv [M, Q], s [M, I]
    weights: torch.Tensor  # per layer: Wqkv, Wo, W_gate_up (interleaved per tile), Wd
    part: torch.Tensor
    ctr: torch.Tensor
    tasks: torch.Tensor  # int64 [T, len(FIELDS)]
    trace: torch.Tensor  # int64 [T, 4]: taken, dependencies met, K loop done, finished (ns, with --trace)
    num_tasks: int
    splits: list[int]
    task_layer: np.ndarray
    task_gemm: np.ndarray
    m: int
    hidden: int
    cfg: Config

    def x(self) -> torch.Tensor:
        return self.act[: self.m * self.hidden].view(self.m, self.hidden)


def interleave_gate_up(w_gu: torch.Tensor, block_n: int) -> torch.Tensor:
    """[gate; up] rows -> per tile of block_n rows: block_n / 2 gate rows, then the same up rows."""
    inter = w_gu.shape[0] // 2
    half = block_n // 2
    if inter % half:
        raise ValueError(f"intermediate {inter} is not a multiple of {half}")
    gate, up = w_gu[:inter].view(inter // half, half, -1), w_gu[inter:].view(inter // half, half, -1)
    return torch.stack((gate, up), dim=1).reshape(2 * inter, -1)


def share_size(k: int, splits: int, block_k: int) -> int:
    return triton.cdiv(triton.cdiv(k, splits), block_k) * block_k


def build_plan(layers: list[Layer], x: torch.Tensor, cfg: Config) -> Plan:
    m, hidden = x.shape
    qkv_out = layers[0].w_qkv.shape[0]
    inter = layers[0].w_d.shape[1]
    bns = cfg.block_n
    bn = bns[GATE_UP]  # gate_up's tile sets its interleave and which down share waits on which tile
    dev = x.device
    # activation arena offsets (elements)
    xa, xb, qkv, s = 0, m * hidden, 2 * m * hidden, 2 * m * hidden + m * qkv_out
    act = torch.zeros(s + m * inter, dtype=x.dtype, device=dev)
    act[: m * hidden].copy_(x.reshape(-1))
    mats = [
        (lambda ly: ly.w_qkv, qkv_out, hidden),
        (lambda ly: ly.w_o, hidden, hidden),
        (lambda ly: interleave_gate_up(ly.w_gu, bn), 2 * inter, hidden),
        (lambda ly: ly.w_d, hidden, inter),
    ]
    per_layer = sum(n * k for _, n, k in mats)
    weights = torch.empty(len(layers) * per_layer, dtype=x.dtype, device=dev)
    w_offs = np.cumsum([0] + [n * k for _, n, k in mats])[:4]
    for i, ly in enumerate(layers):
        for (get, n, k), off in zip(mats, w_offs):
            weights[i * per_layer + off : i * per_layer + off + n * k].copy_(get(ly).reshape(-1))
    ks = [share_size(k, sp, cfg.block_k) for (_, _, k), sp in zip(mats, cfg.splits)]
    splits = [triton.cdiv(k, size) for (_, _, k), size in zip(mats, ks)]
    # a_off a_stride w_off K N KS S out_off out_stride res_off kind, per GEMM
    desc = [
        [xa, hidden, w_offs[0], hidden, qkv_out, ks[0], splits[0], qkv, qkv_out, 0, STORE.value],
        [qkv, qkv_out, w_offs[1], hidden, hidden, ks[1], splits[1], xb, hidden, xa, ADD.value],
        [xb, hidden, w_offs[2], hidden, 2 * inter, ks[2], splits[2], s, inter, 0, SILU.value],
        [s, inter, w_offs[3], inter, hidden, ks[3], splits[3], xa, hidden, xb, ADD.value],
    ]
    # gate_up tile t writes s columns [t * bn/2, (t+1) * bn/2): the down share that reads them waits for it
    if ks[3] % (bn // 2):
        raise ValueError(f"down's K share {ks[3]} is not a multiple of half a tile ({bn // 2})")
    tiles = [triton.cdiv(n, b) for (_, n, _), b in zip(mats, bns)]
    gu_group = [(t * (bn // 2)) // ks[3] for t in range(tiles[GATE_UP])]
    group_count = np.bincount(gu_group, minlength=splits[DOWN])
    # counters: [0] queue; per layer: qkv done, o done, down done, gate_up done per down share; tickets
    per = 3 + splits[DOWN]
    ticket_base = 1 + len(layers) * per
    max_tiles = max(tiles)
    rows = []
    for layer in range(len(layers)):
        base = 1 + layer * per
        for g in (QKV, O_PROJ, GATE_UP, DOWN):
            order = (
                [(s_, n) for s_ in range(splits[g]) for n in range(tiles[g])]
                if g == DOWN
                else [(s_, n) for n in range(tiles[g]) for s_ in range(splits[g])]
            )
            for share, n in order:
                if g == QKV:
                    wait = (1 + (layer - 1) * per + 2, tiles[DOWN]) if layer else (0, 0)
                    done = base
                elif g == O_PROJ:
                    wait, done = (base, tiles[QKV]), base + 1
                elif g == GATE_UP:
                    wait, done = (base + 1, tiles[O_PROJ]), base + 3 + gu_group[n]
                else:
                    wait, done = (base + 3 + share, int(group_count[share])), base + 2
                a_off, a_stride, w_off, k, n_out, k_share, n_splits, out_off, out_stride, res_off, kind = (
                    desc[g]
                )
                k0 = share * k_share
                rows.append(
                    [a_off, a_stride, layer * per_layer + w_off, k, n_out, k0, min(k0 + k_share, k), n_splits,
                     share, out_off, out_stride, res_off, kind, n, wait[0], wait[1], done,
                     ticket_base + g * max_tiles + n, g]
                )  # fmt: skip
    if any(v % 16 for row in rows for v in row[:7] + row[9:12]):
        raise ValueError("offsets, strides and sizes must be multiples of 16")
    if len(rows[0]) != len(FIELDS):
        raise AssertionError(f"a task record has {len(rows[0])} fields, the kernel reads {len(FIELDS)}")
    tasks = torch.tensor(rows, dtype=torch.int64, device=dev)
    part = torch.empty(
        max(sp * m * n for sp, (_, n, _) in zip(splits, mats)), dtype=torch.float32, device=dev
    )
    ctr = torch.zeros(ticket_base + 4 * max_tiles, dtype=torch.int32, device=dev)
    trace = torch.zeros((len(rows), 4), dtype=torch.int64, device=dev)
    layer_of = np.repeat(np.arange(len(layers)), len(rows) // len(layers))
    gemm_of = np.concatenate([np.full(tiles[g] * splits[g], g) for g in range(4)] * len(layers))
    return Plan(act, weights, part, ctr, tasks, trace, len(rows), splits, layer_of, gemm_of, m, hidden, cfg)


def launch(plan: Plan, trace: bool = False) -> None:
    cfg = plan.cfg
    plan.ctr.zero_()
    programs = max(1, cfg.programs_per_sm * num_sms(plan.act.device))
    chain_kernel[(programs,)](
        plan.act, plan.weights, plan.part, plan.ctr, plan.tasks, plan.trace, plan.num_tasks, plan.m,
        BLOCK_M=max(16, triton.next_power_of_2(plan.m)), BN_QKV=cfg.block_n[0], BN_O=cfg.block_n[1],
        BN_GU=cfg.block_n[2], BN_D=cfg.block_n[3], BLOCK_K=cfg.block_k,
        PRECISION=dot_precision(plan.act.dtype), DOT_DTYPE=dot_dtype(plan.act.dtype), PRELOAD=cfg.preload, BACKOFF=cfg.backoff_ns,
        TRACE=trace, CLAIM_AHEAD=cfg.claim_ahead, num_warps=cfg.warps, num_stages=cfg.stages,
    )  # fmt: skip


def trace_summary(plan: Plan) -> None:
    """One traced launch: per GEMM, the median task's wait, K loop and tail, and each phase's span a layer."""
    launch(plan, trace=True)
    torch.cuda.synchronize()
    tr = plan.trace.cpu().numpy().astype(np.float64) / 1e3  # us
    tr -= tr[:, 0].min()
    layers = int(plan.task_layer.max()) + 1
    print(f"    traced: {tr[:, 3].max() / layers:.2f} us a layer ({tr[:, 3].max():.1f} us in all)")
    names = ("qkv", "o", "gate_up", "down")
    for g in range(4):
        sel = (plan.task_gemm == g) & (plan.task_layer > 0)
        first_ready = [
            tr[(plan.task_gemm == g) & (plan.task_layer == ly), 1].min() for ly in range(1, layers)
        ]
        last_done = [tr[(plan.task_gemm == g) & (plan.task_layer == ly), 3].max() for ly in range(1, layers)]
        print(
            f"    {names[g]:8s} wait {np.median(tr[sel, 1] - tr[sel, 0]):5.2f}  loop {np.median(tr[sel, 2] - tr[sel, 1]):5.2f}"
            f"  tail {np.median(tr[sel, 3] - tr[sel, 2]):5.2f}  phase (first met .. last done) "
            f"{np.median(np.subtract(last_done, first_ready)):5.2f} us"
        )
    ends = [tr[(plan.task_gemm == 3) & (plan.task_layer == ly), 3].max() for ly in range(layers)]
    starts = {
        g: [tr[(plan.task_gemm == g) & (plan.task_layer == ly), 1].min() for ly in range(1, layers)]
        for g in range(4)
    }
    prev = np.array(ends[:-1])
    print(
        "    from the last down tile of the layer before, median us to the first task of: "
        + ", ".join(f"{names[g]} {np.median(np.array(starts[g]) - prev):.2f}" for g in range(4))
        + f"; to the layer's last down tile {np.median(np.diff(ends)):.2f}"
    )


def chain_ref(layers: list[Layer], x: torch.Tensor) -> torch.Tensor:
    for ly in layers:
        x = layer_ref(ly, x)
    return x


def engine_tiles(shape: str) -> dict[str, Tile]:
    """What `skinny_tile` picks for qwen2.5-0.5b (kernels/skinny_gemm.py)."""
    return {
        "qkv": Tile(16, 128, 1),
        "o": Tile(32, 128, 4),
        "gate_up": Tile(32, 128, 1),
        "down": Tile(32, 128, 8),
    }


def configs(args: argparse.Namespace) -> list[Config]:
    ints = lambda text: [int(v) for v in text.split(",")]  # noqa: E731
    splits = [tuple(int(v) for v in group.split("/")) for group in args.splits.split(",")]
    bns = [
        tuple(int(v) for v in group.split("/")) * (4 if "/" not in group else 1)
        for group in args.bns.split(",")
    ]
    return [
        Config(bn, bk, sp, pps, warps, stages, bool(pre), bool(ahead), sleep)  # type: ignore[arg-type]
        for bn, bk, sp, pps, warps, stages, pre, ahead, sleep in itertools.product(
            bns,
            ints(args.bks),
            splits,
            ints(args.pps),
            ints(args.warps),
            ints(args.stages),
            ints(args.preload),
            ints(args.claim_ahead),
            ints(args.backoff),
        )
    ]


def probe(shape: str, batch: int, cfgs: list[Config], rounds: int, trace: bool) -> None:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    count = 24
    layers = make_layers(shape, count, device, gen)
    b: Buffers = make_buffers(shape, batch, device, gen)
    x0 = b.x.clone()
    expect = chain_ref(layers, x0.clone())
    print(f"{shape} b={batch}, {count} layers a launch / graph, us per layer")

    tiles = engine_tiles(shape)

    def engine() -> None:
        for ly in layers:
            layer_triton(ly, b, tiles, Launch(pdl=True))

    b.x.copy_(x0)
    engine()
    torch.cuda.synchronize()
    err = (b.x.float() - expect.float()).abs().max().item()
    times = [graph_us_per_layer(engine, count) for _ in range(rounds)]
    print(f"  engine chain (PDL)        {' / '.join(f'{t:6.2f}' for t in times)}   max err {err:.3g}")

    for cfg in cfgs:
        try:
            plan = build_plan(layers, x0, cfg)
            outs = []
            for _ in range(5):
                plan.act[: batch * plan.hidden].copy_(x0.reshape(-1))
                launch(plan)
                torch.cuda.synchronize()
                outs.append(plan.x().clone())
            err = (outs[0].float() - expect.float()).abs().max().item()
            same = all(torch.equal(outs[0], o) for o in outs[1:])
            times = [graph_us_per_layer(lambda p=plan: launch(p), count) for _ in range(rounds)]
            if trace:
                trace_summary(plan)
        except Exception as exc:  # noqa: BLE001 - a config that does not compile or fit is reported, not fatal
            print(f"  {str(cfg):34s} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        print(
            f"  {str(cfg):34s} {' / '.join(f'{t:6.2f}' for t in times)}   max err {err:.3g}, "
            f"5 launches bit for bit: {same}, {plan.num_tasks // count} tasks a layer"
        )


def cpu_check() -> None:
    """The megakernel against the fp32 reference under TRITON_INTERPRET=1 at small shapes."""
    if not is_interpret():
        raise SystemExit("run --check with TRITON_INTERPRET=1")
    SHAPES["tiny"] = (48, 80, 96)
    device = torch.device("cpu")
    for batch, cfg in (
        (5, Config((32,) * 4, 32, (2, 3, 1, 3), 2)),
        (16, Config((16,) * 4, 16, (1, 2, 2, 6), 1)),
        (3, Config((32,) * 4, 16, (3, 1, 1, 1), 3)),
        (7, Config((32,) * 4, 16, (2, 2, 1, 2), 2, preload=True)),
        (9, Config((16,) * 4, 32, (1, 3, 1, 2), 2, claim_ahead=True)),
        (6, Config((16, 32, 64, 16), 16, (1, 2, 1, 3), 2)),
    ):
        for dtype in (torch.float32, torch.bfloat16):
            gen = torch.Generator(device=device).manual_seed(batch)
            layers = make_layers("tiny", 3, device, gen, dtype)
            x0 = make_buffers("tiny", batch, device, gen, dtype).x
            plan = build_plan(layers, x0, cfg)
            launch(plan)
            err = (plan.x().float() - chain_ref(layers, x0.clone()).float()).abs().max().item()
            leftover = int(plan.ctr[1 + 3 * (3 + plan.splits[DOWN]) :].abs().sum())
            print(f"tiny b={batch} {dtype} {cfg}: max err {err:.3g}, tickets left {leftover}")
            assert leftover == 0
            assert err < (1e-4 if dtype == torch.float32 else 0.25), err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,16")
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument(
        "--bns", default="32", help="column tiles: one for all GEMMs or qkv/o/gate_up/down, comma-separated"
    )
    parser.add_argument("--bks", default="128")
    parser.add_argument("--splits", default="2/2/1/8", help="K shares of qkv/o/gate_up/down, comma-separated")
    parser.add_argument("--pps", default="2", help="programs per SM")
    parser.add_argument("--warps", default="4")
    parser.add_argument("--stages", default="3")
    parser.add_argument("--preload", default="0", help="1: first K step's weights before the wait; 0,1: both")
    parser.add_argument("--claim-ahead", default="0", help="1: take the next task's ticket before this one")
    parser.add_argument("--backoff", default="0", help="ns to sleep between polls of a dependency (0: none)")
    parser.add_argument("--trace", action="store_true", help="per-phase timeline of one launch (globaltimer)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="interpreter check on the CPU, then exit")
    args = parser.parse_args()
    if args.check:
        cpu_check()
        return
    for batch in (int(x) for x in args.batches.split(",")):
        probe(args.shape, batch, configs(args), args.rounds, args.trace)


if __name__ == "__main__":
    main()
