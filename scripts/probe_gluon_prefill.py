"""Probe: the long-tile prefill in Gluon without warp specialisation, and what its time is made of. Eight warps
in lockstep, as the Triton kernel's: K/V gathered by cp.async through the block table into a 2-slot K ring and a
3-slot V ring, tile j+1's QK^T wgmma in flight through tile j's softmax (FA3's intra-warpgroup overlap), a CTA
barrier a key tile. It ran as fast as the Triton kernel (~350 TFLOP/s on an H200), not faster; dropping its
loads (NO_LOADS) or its softmax (NO_SOFTMAX) took ~120 us each off a 1024-token chunk over 9216 cached tokens
(468 us), both 245 us, and Nsight Compute put the warps' top stall at the barrier. The warp-specialised kernel
(`roseinfer/kernels/paged_prefill_ws.py`) is what came of it (PERFORMANCE.md, "Fifty-third session").

    python scripts/probe_gluon_prefill.py            # check against the reference, then time beside the shipped kernels
    python scripts/probe_gluon_prefill.py --ablate   # the loads and the softmax left out in turn (wrong outputs)
"""

from __future__ import annotations

import argparse
import functools

import torch
import triton
from sweep_prefill_tiles import CASES, HEADS, build  # scripts/ is on the path when run as a script
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from roseinfer.kernels import paged_prefill_ws
from roseinfer.kernels._common import LOG2E
from roseinfer.kernels.paged_prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
from roseinfer.kernels.paged_prefill_ws import _softmax_step


@gluon.jit
def _issue_kv(smem, base, blks, n, stride_b, stride_s, n_end, d, BLOCK_SIZE: gl.constexpr):
    offs = (blks * stride_b + (n % BLOCK_SIZE) * stride_s)[:, None] + d[None, :]
    cp.async_copy_global_to_shared(smem, base + offs, mask=(n < n_end)[:, None])


@gluon.jit
def _gl_prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_btb,
    stride_ot,
    stride_oh,
    GROUP: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_SIZE: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    q_smem_layout: gl.constexpr,
    kv_smem_layout: gl.constexpr,
    num_warps: gl.constexpr,
    NO_LOADS: gl.constexpr = False,
    NO_SOFTMAX: gl.constexpr = False,
):
    gl.static_assert(BLOCK_M == 16 * num_warps)
    head = gl.program_id(1)
    m_block = gl.num_programs(0) - 1 - gl.program_id(0)
    b = gl.program_id(2)
    kvh = head // GROUP
    q_start = gl.load(query_start_loc_ptr + b)
    q_len = gl.load(query_start_loc_ptr + b + 1) - q_start
    seq_len = gl.load(seq_lens_ptr + b)
    prefix = seq_len - q_len
    m0 = m_block * BLOCK_M
    if m0 >= q_len:
        return

    # K/V and Q tiles in registers for the copies: 8 contiguous halves a thread (16 B).
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // HEAD_DIM, HEAD_DIM // 8], [num_warps, 1], [1, 0])
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ld))
    rows_ld = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld))
    tok_ld = (q_start + rows_ld).to(gl.int64)
    q = gl.load(
        q_ptr + tok_ld[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=(rows_ld < q_len)[:, None],
        other=0.0,
    )
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_smem_layout, q)
    k_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HEAD_DIM], kv_smem_layout)
    v_smem = gl.allocate_shared_memory(dtype, [3, BLOCK_N, HEAD_DIM], kv_smem_layout)

    full_end = ((prefix + m0 + 1) // BLOCK_N) * BLOCK_N
    kv_end = prefix + gl.minimum(m0 + BLOCK_M, q_len)
    full_tiles = full_end // BLOCK_N
    num_tiles = full_tiles + gl.cdiv(kv_end - full_end, BLOCK_N)
    q_pos = prefix + m0 + gl.arange(0, BLOCK_M, layout=row_s)

    bt_row = block_tables_ptr + b.to(gl.int64) * stride_btb
    k_base = k_cache_ptr + kvh * stride_kh
    v_base = v_cache_ptr + kvh * stride_vh
    kn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))

    # Prologue: K_0 (group 1), then V_0 and K_1 (group 2); block ids of tile 2 ready for the loop.
    blk0 = gl.load(bt_row + kn // BLOCK_SIZE, mask=kn < kv_end, other=0).to(gl.int64)
    n1 = BLOCK_N + kn
    blk1 = gl.load(bt_row + n1 // BLOCK_SIZE, mask=n1 < kv_end, other=0).to(gl.int64)
    _issue_kv(k_smem.index(0), k_base, blk0, kn, stride_kb, stride_ks, kv_end, d, BLOCK_SIZE)
    cp.commit_group()
    _issue_kv(v_smem.index(0), v_base, blk0, kn, stride_vb, stride_vs, kv_end, d, BLOCK_SIZE)
    _issue_kv(k_smem.index(1), k_base, blk1, n1, stride_kb, stride_ks, kv_end, d, BLOCK_SIZE)
    cp.commit_group()
    n2 = 2 * BLOCK_N + kn
    blk_a = gl.load(bt_row + n2 // BLOCK_SIZE, mask=n2 < kv_end, other=0).to(gl.int64)  # tile j + 2
    blk_b = blk1  # tile j + 1
    cp.wait_group(1)
    fence_async_shared()
    gl.thread_barrier()

    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    s_cur = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s_cur = warpgroup_mma_wait(0, deps=(s_cur,))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = warpgroup_mma_init(gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout))

    for j in range(0, num_tiles - 1):
        cp.wait_group(0)  # K_{j+1} and V_j
        fence_async_shared()
        gl.thread_barrier()  # every warp's copies landed; every warp is done with K_j and V_{j-2}
        nk = (j + 2) * BLOCK_N + kn
        if not NO_LOADS:
            _issue_kv(k_smem.index(j % 2), k_base, blk_a, nk, stride_kb, stride_ks, kv_end, d, BLOCK_SIZE)
            _issue_kv(
                v_smem.index((j + 1) % 3),
                v_base,
                blk_b,
                nk - BLOCK_N,
                stride_vb,
                stride_vs,
                kv_end,
                d,
                BLOCK_SIZE,
            )
            cp.commit_group()
        blk_b = blk_a
        n3 = nk + BLOCK_N
        blk_a = gl.load(bt_row + n3 // BLOCK_SIZE, mask=n3 < kv_end, other=0).to(gl.int64)

        s_next = warpgroup_mma(
            q_smem, k_smem.index((j + 1) % 2).permute((1, 0)), s_zero, use_acc=False, is_async=True
        )
        if NO_SOFTMAX:
            p = s_cur
            alpha = l_i
        elif j >= full_tiles:
            p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, j * BLOCK_N, q_pos, qk_scale, True, s_layout)
        else:
            p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, j * BLOCK_N, q_pos, qk_scale, False, s_layout)
        acc = warpgroup_mma_wait(1, deps=(acc,))  # the previous PV
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = warpgroup_mma(p_op, v_smem.index(j % 3), acc, is_async=True)
        s_cur = warpgroup_mma_wait(1, deps=(s_next,))

    j = num_tiles - 1
    cp.wait_group(0)
    fence_async_shared()
    gl.thread_barrier()
    p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, j * BLOCK_N, q_pos, qk_scale, True, s_layout)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    acc = warpgroup_mma(p_op, v_smem.index(j % 3), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc,))

    o = acc / gl.convert_layout(l_i, row_o)[:, None]
    rows_o = m0 + gl.arange(0, BLOCK_M, layout=row_o)
    d_o = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    tok_o = (q_start + rows_o).to(gl.int64)
    gl.store(
        out_ptr + tok_o[:, None] * stride_ot + head * stride_oh + d_o[None, :],
        o.to(dtype),
        mask=(rows_o < q_len)[:, None],
    )


def lockstep_prefill(q, k, v, tables, qsl, seq_lens, max_query_len, scale, out, **flags):
    hq, hkv, d = q.shape[1], k.shape[2], q.shape[2]
    gl_dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    grid = (triton.cdiv(max_query_len, 128), hq, qsl.shape[0] - 1)
    _gl_prefill_kernel[grid](
        q, k, v, tables, qsl, seq_lens, out, scale * LOG2E, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        k.stride(2), v.stride(0), v.stride(1), v.stride(2), tables.stride(0), out.stride(0), out.stride(1),
        GROUP=hq // hkv, HEAD_DIM=d, BLOCK_SIZE=k.shape[1], BLOCK_M=128, BLOCK_N=128,
        q_smem_layout=gl.NVMMASharedLayout.get_default_for([128, d], gl_dtype),
        kv_smem_layout=gl.NVMMASharedLayout.get_default_for([128, d], gl_dtype), num_warps=8, **flags,
    )  # fmt: skip
    return out


def shipped(ws: bool, *args):
    paged_prefill_ws.ENABLED = ws
    try:
        return paged_prefill_attention(*args, block_m=128)
    finally:
        paged_prefill_ws.ENABLED = True


def us(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ablate", action="store_true")
    parser.add_argument("--cases", default="1 x 1024 over 9216,1 x 1024 over 4096,4 x 2048 fresh")
    args = parser.parse_args()
    heads = HEADS["llama-3.1-8b"]
    for name in args.cases.split(","):
        q, k, v, tables, qsl, sl, longest, flops = build(CASES[name], heads)
        call = (q, k, v, tables, qsl, sl, longest, heads[2] ** -0.5)
        out = torch.empty_like(q)
        if args.ablate:
            cells = []
            for flags in (
                {},
                {"NO_LOADS": True},
                {"NO_SOFTMAX": True},
                {"NO_LOADS": True, "NO_SOFTMAX": True},
            ):
                run = functools.partial(lockstep_prefill, *call, out, **flags)
                cells.append(f"{'+'.join(flags) or 'whole'} {us(run):.1f}")
            print(f"{name}: " + ", ".join(cells) + " (us)", flush=True)
            continue
        ref = paged_prefill_attention_ref(*call).float()
        err = (lockstep_prefill(*call, out).float() - ref).abs().max().item()
        times = {
            "Triton 128x128": us(functools.partial(shipped, False, *call)),
            "warp-specialised": us(functools.partial(shipped, True, *call)),
            "lockstep Gluon": us(functools.partial(lockstep_prefill, *call, out)),
        }
        cells = ", ".join(f"{k} {t:.1f} us ({flops / t / 1e6:.0f} TFLOP/s)" for k, t in times.items())
        print(f"{name}: {cells}; lockstep max err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
