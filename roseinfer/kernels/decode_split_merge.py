"""The end of a paged decode attention program that holds one split of its (sequence, kv head)'s keys
(`paged_decode_attention.py`): it stores its partial and takes a ticket, and the last program to finish
merges every split, in the same launch. And, in a launch that cuts its splits on the GPU (`gpu_split`), which
split of which row a program holds."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gpu_split(
    p,
    kvh,
    order_ptr,
    seq_lens_ptr,
    live_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    num_kv_heads,
    target_programs,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    MIN_KEYS: tl.constexpr,
):
    """Program slot `p` of a launch of R slots a kv head over R rows, of which the first `live` (`live_ptr`, on
    the device) are served: each served row gets `splits` slots, as `choose_num_splits` would give `live` rows
    (about `target_programs` programs, no split under MIN_KEYS keys of the longest row, `order[0]`'s, at most
    SPLITS_PAD and R // live). Slot p also writes row order[p]'s zero output when p >= live. Returns (sequence,
    served row, split, splits, whether the slot serves a row)."""
    rows = tl.num_programs(1)
    live = tl.load(live_ptr)
    n = tl.maximum(live, 1)
    longest = tl.load(seq_lens_ptr + tl.load(order_ptr))
    splits = tl.minimum(rows // n, tl.cdiv(target_programs, n * num_kv_heads))
    splits = tl.maximum(tl.minimum(tl.minimum(splits, tl.cdiv(longest, MIN_KEYS)), SPLITS_PAD), 1)
    if p >= live:
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, D_PAD)
        empty = tl.load(order_ptr + p).to(tl.int64)
        dst = out_ptr + empty * stride_ob + (kvh * GROUP + g)[:, None] * stride_oh + d[None, :]
        zero = tl.zeros([GROUP_PAD, D_PAD], dtype=out_ptr.dtype.element_ty)
        tl.store(dst, zero, mask=(g < GROUP)[:, None] & (d < HEAD_DIM)[None, :])
    row = p // splits
    serves = row < live
    b = tl.load(order_ptr + tl.where(serves, row, 0))
    return b, row, p % splits, splits, serves


@triton.jit
def _load_acc_chunk(part_acc_ptr, rows, c0, c, g_mask, d, d_mask, num_splits, HEAD_DIM: tl.constexpr):
    """Splits c0 + c's acc partials [G, C, D] of the heads whose partials start at `rows`, and their [G, C]
    mask."""
    c_mask = g_mask[:, None] & ((c0 + c) < num_splits)[None, :]
    acc_c = tl.load(
        part_acc_ptr + (rows[:, None] + c0 + c[None, :])[:, :, None] * HEAD_DIM + d[None, None, :],
        mask=c_mask[:, :, None] & d_mask[None, None, :],
        other=0.0,
        cache_modifier=".cg",
    )
    return acc_c, c_mask


@triton.jit
def merge_decode_splits(
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    rows,
    g_mask,
    d,
    d_mask,
    num_splits,
    GROUP_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    SPLITS_CHUNK: tl.constexpr,
):
    """The normalised output [GROUP_PAD, D_PAD] (fp32) of the query heads whose partials start at `rows`
    (each head's `num_splits` partials are contiguous: m and l [.., S], acc [.., S, HEAD_DIM])."""
    # Every split's partials in one round of loads (not a loop of dependent ones): [G, S] and
    # [G, S, D] in chunks of SPLITS_CHUNK splits, weighted by exp2(m - max m).
    sp = tl.arange(0, SPLITS_PAD)
    if SPLITS_CHUNK == SPLITS_PAD:
        # One chunk: its acc loads go out with m and l's, before anything waits on them.
        acc_all, ms_mask = _load_acc_chunk(part_acc_ptr, rows, 0, sp, g_mask, d, d_mask, num_splits, HEAD_DIM)
    else:
        ms_mask = g_mask[:, None] & (sp < num_splits)[None, :]
    idx = rows[:, None] + sp[None, :]
    m_all = tl.load(part_m_ptr + idx, mask=ms_mask, other=float("-inf"), cache_modifier=".cg")
    l_all = tl.load(part_l_ptr + idx, mask=ms_mask, other=0.0, cache_modifier=".cg")
    m_max = tl.max(m_all, axis=1)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # every split empty: all weights 0
    w_all = tl.exp2(m_all - m_max[:, None])
    total = tl.sum(w_all * l_all, axis=1)
    if SPLITS_CHUNK == SPLITS_PAD:
        merged = tl.sum(w_all[:, :, None] * acc_all, axis=1)
    else:
        merged = tl.zeros([GROUP_PAD, D_PAD], dtype=tl.float32)
        c = tl.arange(0, SPLITS_CHUNK)
        for c0 in tl.static_range(0, SPLITS_PAD, SPLITS_CHUNK):
            acc_c, c_mask = _load_acc_chunk(
                part_acc_ptr, rows, c0, c, g_mask, d, d_mask, num_splits, HEAD_DIM
            )
            m_c = tl.load(
                part_m_ptr + rows[:, None] + c0 + c[None, :],
                mask=c_mask,
                other=float("-inf"),
                cache_modifier=".cg",
            )
            merged += tl.sum(tl.exp2(m_c - m_max[:, None])[:, :, None] * acc_c, axis=1)
    return merged / tl.where(total > 0.0, total, 1.0)[:, None]


@triton.jit
def finish_split(
    m_i,
    l_i,
    acc,
    split,
    rows,
    g_mask,
    d,
    d_mask,
    o_rows,
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    counter,
    num_splits,
    GROUP_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    SPLITS_CHUNK: tl.constexpr,
):
    """Store split `split`'s partial (m_i, l_i, acc) of the query heads whose partials start at `rows`, then
    take a ticket on `counter`: the last of the `num_splits` programs merges them all into `o_rows` and
    resets the counter for the next launch."""
    tl.store(part_m_ptr + rows + split, m_i, mask=g_mask)
    tl.store(part_l_ptr + rows + split, l_i, mask=g_mask)
    q_mask = g_mask[:, None] & d_mask[None, :]
    tl.store(part_acc_ptr + (rows + split)[:, None] * HEAD_DIM + d[None, :], acc, mask=q_mask)
    # The barrier orders all threads' partial stores before the (acq_rel, gpu-scope) ticket.
    tl.debug_barrier()
    ticket = tl.atomic_add(counter, 1)
    if ticket == num_splits - 1:
        out = merge_decode_splits(
            part_m_ptr,
            part_l_ptr,
            part_acc_ptr,
            rows,
            g_mask,
            d,
            d_mask,
            num_splits,
            GROUP_PAD,
            D_PAD,
            HEAD_DIM,
            SPLITS_PAD,
            SPLITS_CHUNK,
        )
        tl.store(o_rows, out.to(out_ptr.dtype.element_ty), mask=q_mask)
        tl.atomic_xchg(counter, 0)  # ready for the next launch
