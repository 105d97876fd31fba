"""Device code of `probe_layer_megakernel.py`: a small model's decode GEMM chain, every layer, in one launch of
persistent programs that take (GEMM, column tile, K share) tasks from a queue and wait per tile on what they
read. The host side (task list, arenas, counters) and the measurements are in the probe."""

from __future__ import annotations

import triton
import triton.language as tl

QKV, O_PROJ, GATE_UP, DOWN = 0, 1, 2, 3
STORE, ADD, SILU = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
# int64 fields of a task's record
FIELDS = (
    "a_off a_stride w_off K N k0 k_end S share out_off out_stride res_off kind n wait_idx wait_target done_idx "
    "ticket_idx gemm"
).split()
REC: tl.constexpr = tl.constexpr(len(FIELDS))


@triton.jit
def _now():
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _sleep(ns: tl.constexpr):
    tl.inline_asm_elementwise(
        "nanosleep.u32 $1; mov.u32 $0, 0;", "=r,r", [tl.full((), ns, tl.int32)], dtype=tl.int32, is_pure=False,
        pack=1,
    )  # fmt: skip


@triton.jit
def _load_record(task_ptr, t, num_tasks):
    """A task's fields (zeros past the end). Offsets, strides and sizes are multiples of 16 elements
    (`build_plan` checks): without the hints, loads at offsets read from memory would not be vectorised."""
    ok = t < num_tasks
    r = task_ptr + t.to(tl.int64) * REC
    return (
        tl.multiple_of(tl.load(r, mask=ok, other=0), 16),
        tl.multiple_of(tl.load(r + 1, mask=ok, other=0), 16),
        tl.multiple_of(tl.load(r + 2, mask=ok, other=0), 16),
        tl.multiple_of(tl.load(r + 3, mask=ok, other=0), 16),
        tl.multiple_of(tl.load(r + 4, mask=ok, other=0), 16),
        tl.multiple_of(tl.load(r + 5, mask=ok, other=0), 16),
        tl.multiple_of(tl.load(r + 6, mask=ok, other=0), 16),
        tl.load(r + 7, mask=ok, other=0),
        tl.load(r + 8, mask=ok, other=0),
        tl.multiple_of(tl.load(r + 9, mask=ok, other=0), 16),
        tl.multiple_of(tl.load(r + 10, mask=ok, other=0), 16),
        tl.multiple_of(tl.load(r + 11, mask=ok, other=0), 16),
        tl.load(r + 12, mask=ok, other=0),
        tl.load(r + 13, mask=ok, other=0),
        tl.load(r + 14, mask=ok, other=0),
        tl.load(r + 15, mask=ok, other=0),
        tl.load(r + 16, mask=ok, other=0),
        tl.load(r + 17, mask=ok, other=0),
        tl.load(r + 18, mask=ok, other=0),
    )


@triton.jit
def _run_task(
    act_ptr, w_ptr, part_ptr, ctr_ptr, trace_ptr, t, M, rec,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRELOAD: tl.constexpr, TRACE: tl.constexpr, BACKOFF: tl.constexpr,
):  # fmt: skip
    (a_off, a_stride, w_off, K, N, k0, k_end, S, share, out_off, out_stride, res_off, kind, n, wait_idx,
     wait_target, done_idx, ticket_idx, _) = rec  # fmt: skip
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    kk = tl.arange(0, BLOCK_K)
    cols = n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_mask = cols < N
    w_cols = w_ptr + w_off + cols[None, :].to(tl.int64) * K
    a_rows = act_ptr + a_off + offs_m[:, None] * a_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_first = k0
    if PRELOAD:  # the first K step's weights do not depend on anything: load them before the wait
        w0 = tl.load(
            w_cols + (k0 + kk)[:, None], mask=c_mask[None, :] & ((k0 + kk) < k_end)[:, None], other=0.0
        )
        k_first = k0 + BLOCK_K
    if wait_target > 0:
        seen = tl.atomic_add(ctr_ptr + wait_idx, 0, sem="acquire")
        while seen < wait_target:
            if BACKOFF > 0:  # fewer polls of one L2 line by the programs that wait on it
                _sleep(BACKOFF)
            seen = tl.atomic_add(ctr_ptr + wait_idx, 0, sem="acquire")
    if TRACE:
        tl.store(trace_ptr + t * 4 + 1, _now())
    if PRELOAD:
        a0 = tl.load(a_rows + (k0 + kk)[None, :], mask=m_mask[:, None] & ((k0 + kk) < k_end)[None, :], other=0.0,
                     cache_modifier=".cg")  # fmt: skip
        acc = tl.dot(a0.to(DOT_DTYPE), w0.to(DOT_DTYPE), acc, input_precision=PRECISION)
    for k in range(k_first, k_end, BLOCK_K):
        offs_k = k + kk
        k_mask = offs_k < k_end
        a = tl.load(a_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        w = tl.load(w_cols + offs_k[:, None], mask=c_mask[None, :] & k_mask[:, None], other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), w.to(DOT_DTYPE), acc, input_precision=PRECISION)
    if TRACE:
        tl.store(trace_ptr + t * 4 + 2, _now())

    mn_mask = m_mask[:, None] & c_mask[None, :]
    last = S > 0  # a tensor, as the ticket test below
    if S > 1:
        part = part_ptr + (share * M + offs_m[:, None]) * N + cols[None, :]
        tl.store(part, acc, mask=mn_mask)
        tl.debug_barrier()  # every thread's partial before the (acq_rel, gpu-scope) ticket
        ticket = tl.atomic_add(ctr_ptr + ticket_idx, 1)
        last = ticket == S - 1
        if last:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for j in range(0, S):
                acc += tl.load(part_ptr + (j * M + offs_m[:, None]) * N + cols[None, :], mask=mn_mask,
                               other=0.0, cache_modifier=".cg")  # fmt: skip
            tl.atomic_xchg(ctr_ptr + ticket_idx, 0)  # ready for the next layer's use of this tile
    if last:
        out_ty = act_ptr.dtype.element_ty
        if kind == SILU:
            gu = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            gate, up = tl.split(gu)
            half = n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
            h_mask = m_mask[:, None] & (half < N // 2)[None, :]
            s = gate * tl.sigmoid(gate) * up
            tl.store(act_ptr + out_off + offs_m[:, None] * out_stride + half[None, :], s.to(out_ty),
                     mask=h_mask)  # fmt: skip
        else:
            out = act_ptr + out_off + offs_m[:, None] * out_stride + cols[None, :]
            if kind == ADD:
                res = act_ptr + res_off + offs_m[:, None] * out_stride + cols[None, :]
                acc += tl.load(res, mask=mn_mask, other=0.0, cache_modifier=".cg").to(tl.float32)
            tl.store(out, acc.to(out_ty), mask=mn_mask)
        tl.debug_barrier()  # every thread's output before the release
        tl.atomic_add(ctr_ptr + done_idx, 1, sem="release")
    if TRACE:
        tl.store(trace_ptr + t * 4 + 3, _now())


@triton.jit
def _run_gemm_task(
    act_ptr, w_ptr, part_ptr, ctr_ptr, trace_ptr, t, M, rec,
    BLOCK_M: tl.constexpr, BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_D: tl.constexpr,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr, PRELOAD: tl.constexpr,
    TRACE: tl.constexpr, BACKOFF: tl.constexpr,
):  # fmt: skip
    """`_run_task` with the task's GEMM's own column tile (a compiled copy per GEMM)."""
    gemm = rec[18]
    if gemm == 0:
        _run_task(act_ptr, w_ptr, part_ptr, ctr_ptr, trace_ptr, t, M, rec, BLOCK_M, BN_QKV, BLOCK_K, PRECISION,
                  DOT_DTYPE, PRELOAD, TRACE, BACKOFF)  # fmt: skip
    elif gemm == 1:
        _run_task(act_ptr, w_ptr, part_ptr, ctr_ptr, trace_ptr, t, M, rec, BLOCK_M, BN_O, BLOCK_K, PRECISION,
                  DOT_DTYPE, PRELOAD, TRACE, BACKOFF)  # fmt: skip
    elif gemm == 2:
        _run_task(act_ptr, w_ptr, part_ptr, ctr_ptr, trace_ptr, t, M, rec, BLOCK_M, BN_GU, BLOCK_K, PRECISION,
                  DOT_DTYPE, PRELOAD, TRACE, BACKOFF)  # fmt: skip
    else:
        _run_task(act_ptr, w_ptr, part_ptr, ctr_ptr, trace_ptr, t, M, rec, BLOCK_M, BN_D, BLOCK_K, PRECISION,
                  DOT_DTYPE, PRELOAD, TRACE, BACKOFF)  # fmt: skip


@triton.jit
def chain_kernel(
    act_ptr, w_ptr, part_ptr, ctr_ptr, task_ptr, trace_ptr, num_tasks, M,
    BLOCK_M: tl.constexpr, BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_D: tl.constexpr,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr, PRELOAD: tl.constexpr,
    TRACE: tl.constexpr, BACKOFF: tl.constexpr, CLAIM_AHEAD: tl.constexpr,
):  # fmt: skip
    t = tl.atomic_add(ctr_ptr, 1)
    rec = _load_record(task_ptr, t, num_tasks)
    while t < num_tasks:
        if TRACE:
            tl.store(trace_ptr + t * 4, _now())
        if CLAIM_AHEAD:
            # Claim the next task now, so the ticket's and its record's round trips overlap this task. The
            # smallest unfinished task is always being run (its program finished everything it took
            # before), so this cannot deadlock either.
            t_next = tl.atomic_add(ctr_ptr, 1)
            rec_next = _load_record(task_ptr, t_next, num_tasks)
        _run_gemm_task(act_ptr, w_ptr, part_ptr, ctr_ptr, trace_ptr, t, M, rec, BLOCK_M, BN_QKV, BN_O, BN_GU, BN_D,
                       BLOCK_K, PRECISION, DOT_DTYPE, PRELOAD, TRACE, BACKOFF)  # fmt: skip
        if not CLAIM_AHEAD:
            t_next = tl.atomic_add(ctr_ptr, 1)
            rec_next = _load_record(task_ptr, t_next, num_tasks)
        t = t_next
        rec = rec_next
