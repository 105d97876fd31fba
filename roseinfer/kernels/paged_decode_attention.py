"""Paged decode attention: one query token per sequence over the sequence's KV blocks (split-K flash-decoding).

Program (b, kv_head, split) walks a contiguous, BLOCK_N-aligned share of sequence b's keys, loads each K/V
tile once and serves all `num_heads // num_kv_heads` query heads of that kv head with one `tl.dot` (the
query heads are padded to a tile of at least 16 rows). It writes a partial (running max, running sum,
unnormalised accumulator) per split; a second kernel merges the splits. With one split the first kernel
normalises and writes the output itself.

The split boundaries come from `seq_lens` on the device, so the launch depends only on shapes and
`num_splits` (CUDA-graph safe); `num_splits` only changes how the work is cut, never the result.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roseinfer.kernels._common import (
    LOG2E,
    check_paged_cache,
    dot_dtype,
    dot_precision,
    is_interpret,
    num_sms,
)

# A split shorter than this many keys is not worth its partial write and merge.
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 32
# Aim for this many programs per SM: decode is bound by memory, and several resident programs per SM keep
# enough loads in flight (on H100, 3 keeps batch 64 x 8 kv heads at one split, its fastest).
PROGRAMS_PER_SM = 3


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    qk_scale,
    num_q_heads,
    num_splits,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_btb,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DIRECT_OUT: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    b64 = b.to(tl.int64)

    seq_len = tl.load(seq_lens_ptr + b)
    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, seq_len)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D_PAD)
    heads = kvh * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    q = tl.load(
        q_ptr + b64 * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], dtype=tl.float32)

    bt_row = block_tables_ptr + b64 * stride_btb
    k_base = k_cache_ptr + kvh * stride_kh
    v_base = v_cache_ptr + kvh * stride_vh
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        if BLOCK_SIZE >= BLOCK_N:
            # The tile lies inside one block (both are powers of two and tiles are BLOCK_N-aligned).
            blk = tl.load(bt_row + n0 // BLOCK_SIZE).to(tl.int64)
            k_rows = blk * stride_kb + (n % BLOCK_SIZE) * stride_ks
            v_rows = blk * stride_vb + (n % BLOCK_SIZE) * stride_vs
        else:
            blks = tl.load(bt_row + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
            k_rows = blks * stride_kb + (n % BLOCK_SIZE) * stride_ks
            v_rows = blks * stride_vb + (n % BLOCK_SIZE) * stride_vs
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + k_rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q.to(DOT_DTYPE), tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION) * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + v_rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(
            p.to(v.dtype).to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION
        )
        m_i = m_new

    if DIRECT_OUT:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + b64 * stride_ob + heads[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=g_mask[:, None] & d_mask[None, :],
        )
    else:
        # Partials are [B, Hq, num_splits] (m, l) and [B, Hq, num_splits, HEAD_DIM] (acc), contiguous.
        row = (b64 * num_q_heads + heads) * num_splits + split
        tl.store(part_m_ptr + row, m_i, mask=g_mask)
        tl.store(part_l_ptr + row, l_i, mask=g_mask)
        tl.store(
            part_acc_ptr + row[:, None] * HEAD_DIM + d[None, :], acc, mask=g_mask[:, None] & d_mask[None, :]
        )


@triton.jit
def _decode_reduce_kernel(
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    num_q_heads,
    num_splits,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, D_PAD)
    s_mask = s < num_splits
    d_mask = d < HEAD_DIM
    row = (b * num_q_heads + h) * num_splits + s
    m = tl.load(part_m_ptr + row, mask=s_mask, other=float("-inf"))
    l_s = tl.load(part_l_ptr + row, mask=s_mask, other=0.0)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # every split empty (seq_len 0): weights all 0
    w = tl.exp2(m - m_max)
    total = tl.sum(w * l_s, axis=0)
    acc = tl.load(
        part_acc_ptr + row[:, None] * HEAD_DIM + d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0
    )
    o = tl.sum(acc * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, o.to(out_ptr.dtype.element_ty), mask=d_mask)


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """How many splits to cut each sequence into so that `batch * num_kv_heads * splits` fills the GPU.

    Uses only host ints (no device reads), so it is safe under CUDA-graph capture; the result is a launch
    shape, so a captured graph keeps the value it was captured with (it stays correct for any `seq_lens`).
    """
    programs = max(1, batch * num_kv_heads)
    target = PROGRAMS_PER_SM * num_sms(device)
    if programs >= target:
        return 1
    splits = triton.cdiv(target, programs)
    splits = min(splits, triton.cdiv(max(max_seq_len, 1), MIN_KEYS_PER_SPLIT), MAX_SPLITS)
    return max(1, splits)


def _decode_config(head_dim_pad: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages)."""
    if is_interpret():
        return 32, 4, 1
    if dtype == torch.float32 or head_dim_pad > 128:
        return 32, 4, 2
    # Swept on H100/H200 (bf16, block size 16, CUDA-graph timed): 16 KiB K and V tiles are best; D=128 at
    # batch 64 x 4k reads K/V at ~97% of the device-to-device copy bandwidth.
    if head_dim_pad <= 64:
        return 128, 4, 3
    return 64, 4, 3


def paged_decode_attention(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its `seq_lens[b]` cached keys; returns [B, Hq, D].

    A sequence of length 0 gets a zero output. `num_splits=None` picks a split count from the batch shape
    and the block table's capacity; pass it explicitly (e.g. from `choose_num_splits` with the step's
    max_seq_len) to control it.
    """
    block_size, num_kv_heads, head_dim = check_paged_cache(k_cache, v_cache)
    batch, num_q_heads, q_dim = q.shape
    if q_dim != head_dim:
        raise ValueError(f"q head_dim {q_dim} != cache head_dim {head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if seq_lens.shape[0] < batch or block_tables.shape[0] < batch:
        raise ValueError("seq_lens/block_tables have fewer rows than q")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} with a contiguous last dim")
    if batch == 0:
        return out

    group = num_q_heads // num_kv_heads
    group_pad = max(16, triton.next_power_of_2(group))
    d_pad = max(16, triton.next_power_of_2(head_dim))
    if num_splits is None:
        num_splits = choose_num_splits(batch, num_kv_heads, block_tables.shape[1] * block_size, q.device)
    num_splits = max(1, int(num_splits))
    block_n, num_warps, num_stages = _decode_config(d_pad, q.dtype)
    direct = num_splits == 1
    if direct:
        part_m = part_l = part_acc = out  # unused
    else:
        part_m = torch.empty((batch, num_q_heads, num_splits), dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(
            (batch, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )

    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_m,
        part_l,
        part_acc,
        scale * LOG2E,
        num_q_heads,
        num_splits,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        D_PAD=d_pad,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        DIRECT_OUT=direct,
        PRECISION=dot_precision(q.dtype),
        DOT_DTYPE=dot_dtype(q.dtype),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if not direct:
        _decode_reduce_kernel[(batch, num_q_heads)](
            out,
            part_m,
            part_l,
            part_acc,
            num_q_heads,
            num_splits,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            D_PAD=d_pad,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
            num_warps=4 if d_pad >= 128 else 2,
        )
    return out


def gather_sequence_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence's first `seq_len` keys and values, `[seq_len, Hkv, D]` each, read through its block table."""
    block_size = k_cache.shape[1]
    pos = torch.arange(seq_len, device=k_cache.device)
    blocks = block_table.to(torch.int64)[pos // block_size]
    offs = pos % block_size
    return k_cache[blocks, offs], v_cache[blocks, offs]


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Plain torch: gather each sequence's K/V through its block table, softmax in fp32."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.zeros_like(q)
    lens = seq_lens.tolist()
    for b in range(batch):
        n = int(lens[b])
        if n == 0:
            continue
        k, v = gather_sequence_kv(k_cache, v_cache, block_tables[b], n)
        k = k.float().repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = v.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale
        probs = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", probs, v).to(q.dtype)
    return out
