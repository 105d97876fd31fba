"""Paged prefill attention: causal attention of each sequence's chunk of new tokens over its whole context.

The new tokens' K/V are already in the cache (written by `store_kv`), so the cached prefix and the chunk
are both read through the block table. Program (q_tile, head, seq) takes BLOCK_M query rows of one
sequence and one query head and runs a flash-attention online softmax over BLOCK_N-key tiles: first the
tiles every row of the q tile sees in full (no mask), then the diagonal tiles with the causal mask.
Query row j of sequence i sits at position `seq_lens[i] - q_len_i + j` and sees keys at positions <= it.

A tile-map launch (`prefill_plan.prefill_tile_map`) may cut a q tile's keys across several programs, as
flash-decoding does for one query: a short chunk over a long cached prefix otherwise makes few programs,
each walking every key in turn. Each such program writes a partial (running max, running sum, unnormalised
accumulator) and takes a ticket; the last of the tile's programs to finish merges them, in the same launch.
On Hopper, LONG_TILE launches whose keys are not cut run the warp-specialised kernel (`paged_prefill_ws.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roseinfer.kernels import paged_prefill_ws as prefill_ws
from roseinfer.kernels._common import (
    LOG2E,
    attention_dot_dtype,
    cdiv,
    check_paged_cache,
    dot_dtype,
    dot_precision,
    gather_sequence_kv,
    next_power_of_2,
)
from roseinfer.kernels.direct_launch import DirectLaunch
from roseinfer.kernels.paged_decode_split import merge_counters
from roseinfer.kernels.prefill_online_softmax import attend_tile, merge_key_splits
from roseinfer.kernels.prefill_plan import TILE_ROWS, prefill_block_m, prefill_config


@triton.jit(do_not_specialize=["first_seq", "tile_stride", "stride_btb"])  # they vary per step
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    tile_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    counters_ptr,
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
    first_seq,
    tile_stride,
    num_q_heads,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    TILE_MAP: tl.constexpr,
    KEY_SPLIT: tl.constexpr,
):
    split = 0
    num_splits = 1
    part_base = 0
    if TILE_MAP:
        # Program t takes the tile the host listed at t (a CUDA graph's fixed grid); -1 marks spare programs,
        # which leave at once. Heads vary fastest: blocks start in grid order, so every listed tile starts
        # before the spare programs at the end of the map take a slot. One grid axis, which has room for any
        # map (a second axis stops at 65,535).
        pid = tl.program_id(0)
        head = pid % num_q_heads
        entry = pid // num_q_heads
        b = tl.load(tile_ptr + entry)
        if b < 0:
            return
        m_block = tl.load(tile_ptr + tile_stride + entry)
        if KEY_SPLIT:
            split = tl.load(tile_ptr + 2 * tile_stride + entry)
            num_splits = tl.load(tile_ptr + 3 * tile_stride + entry)
            part_base = tl.load(tile_ptr + 4 * tile_stride + entry)
    else:
        head = tl.program_id(1)
        # Longest (last, most keys) q tiles first, so the tail of the launch is made of short programs.
        m_block = tl.num_programs(0) - 1 - tl.program_id(0)
        b = tl.program_id(2) + first_seq
    kvh = head // GROUP

    q_start = tl.load(query_start_loc_ptr + b)
    q_len = tl.load(query_start_loc_ptr + b + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + b)
    prefix = seq_len - q_len  # context tokens cached before this chunk
    m0 = m_block * BLOCK_M
    active = m0 < q_len

    local = tl.arange(0, BLOCK_M)
    rows = m0 + local
    row_mask = rows < q_len
    d = tl.arange(0, D_PAD)
    d_mask = d < HEAD_DIM
    tok = (q_start + rows).to(tl.int64)
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if DOT_DTYPE == tl.float16:  # bf16 queries over an fp8 cache (`attention_dot_dtype`): K/V widen to fp16
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    q_pos = prefix + rows

    # Keys at positions <= prefix + m0 are visible to every row of the tile; whole tiles of them need no mask.
    full_end = tl.where(active, ((prefix + m0 + 1) // BLOCK_N) * BLOCK_N, 0)
    kv_end = tl.where(active, prefix + tl.minimum(m0 + BLOCK_M, q_len), 0)
    # This program's share of the tile's key tiles (all of them unless the keys are split): [j0, j1), the
    # unmasked ones first, then the diagonal ones.
    full_tiles = full_end // BLOCK_N
    key_tiles = full_tiles + tl.cdiv(kv_end - full_end, BLOCK_N)
    j0 = split * key_tiles // num_splits
    j1 = (split + 1) * key_tiles // num_splits

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)

    bt_row = block_tables_ptr + b.to(tl.int64) * stride_btb
    k_base = k_cache_ptr + kvh * stride_kh
    v_base = v_cache_ptr + kvh * stride_vh
    for n0 in range(j0 * BLOCK_N, tl.minimum(j1, full_tiles) * BLOCK_N, BLOCK_N):
        m_i, l_i, acc = attend_tile(
            q,
            m_i,
            l_i,
            acc,
            n0,
            full_end,
            q_pos,
            bt_row,
            k_base,
            v_base,
            d,
            d_mask,
            stride_kb,
            stride_ks,
            stride_vb,
            stride_vs,
            qk_scale,
            BLOCK_SIZE,
            BLOCK_N,
            False,
            EVEN_D,
            PRECISION,
            DOT_DTYPE,
            KEY_SPLIT,
        )
    for n0 in range(tl.maximum(j0, full_tiles) * BLOCK_N, j1 * BLOCK_N, BLOCK_N):
        m_i, l_i, acc = attend_tile(
            q,
            m_i,
            l_i,
            acc,
            n0,
            kv_end,
            q_pos,
            bt_row,
            k_base,
            v_base,
            d,
            d_mask,
            stride_kb,
            stride_ks,
            stride_vb,
            stride_vs,
            qk_scale,
            BLOCK_SIZE,
            BLOCK_N,
            True,
            EVEN_D,
            PRECISION,
            DOT_DTYPE,
            KEY_SPLIT,
        )

    o_ptrs = out_ptr + tok[:, None] * stride_ot + head * stride_oh + d[None, :]
    o_mask = row_mask[:, None] & d_mask[None, :]
    # The merge is compiled only into the KEY_SPLIT variant (its atomics need an int32 counter buffer).
    whole = True
    if KEY_SPLIT:
        whole = num_splits == 1
    if whole:
        o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=o_mask)
    elif KEY_SPLIT:
        # Partials are [rows, Hq] (m, l) and [rows, Hq, HEAD_DIM] (acc): the tile's splits take consecutive
        # runs of its rows from part_base on.
        rows_here = tl.minimum(BLOCK_M, q_len - m0)
        part_rows = part_base + split * rows_here + local
        idx = part_rows * num_q_heads + head
        tl.store(part_m_ptr + idx, m_i, mask=row_mask)
        tl.store(part_l_ptr + idx, l_i, mask=row_mask)
        tl.store(part_acc_ptr + idx[:, None] * HEAD_DIM + d[None, :], acc, mask=o_mask)
        # The barrier orders all threads' partial stores before the (acq_rel, gpu-scope) ticket.
        tl.debug_barrier()
        counter = counters_ptr + part_base * num_q_heads + head
        ticket = tl.atomic_add(counter, 1)
        if ticket == num_splits - 1:
            o = merge_key_splits(
                m_i,
                l_i,
                acc,
                split,
                num_splits,
                part_rows,
                rows_here,
                part_m_ptr,
                part_l_ptr,
                part_acc_ptr,
                head,
                num_q_heads,
                d,
                d_mask,
                row_mask,
                HEAD_DIM,
            )
            tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=o_mask)
            tl.atomic_xchg(counter, 0)  # ready for the next launch


launcher = DirectLaunch(_prefill_kernel)


def paged_prefill_attention(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    query_start_loc: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32, context length including the new tokens
    max_query_len: int,
    scale: float,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    first_seq: int = 0,
    tiles: torch.Tensor | None = None,
    split_rows: int = 0,
) -> torch.Tensor:
    """Causal attention of every sequence's new tokens over its cached context plus themselves; [T, Hq, D].

    Only sequences `first_seq..B-1` are computed (the others, e.g. decodes, are left to another kernel);
    rows of `q` outside their `query_start_loc` range are not written. `block_m`/`block_n` override the
    tile shape (powers of two >= 16).

    `tiles` ([TILE_ROWS, N] int32 from `prefill_tile_map`, built with `block_m`) fixes the grid at N
    programs per head, whatever the step holds: the launch a CUDA graph can replay. `max_query_len` and
    `first_seq` are then not read; the tile map names the sequences. `split_rows` > 0: the map may cut
    tiles' keys across programs, whose partials take at most that many rows (the map's `max_rows`); 0: its
    split columns are not read.
    """
    block_size, num_kv_heads, head_dim = check_paged_cache(k_cache, v_cache, q.dtype)
    num_tokens, num_q_heads, q_dim = q.shape
    if q_dim != head_dim:
        raise ValueError(f"q head_dim {q_dim} != cache head_dim {head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    num_seqs = query_start_loc.shape[0] - 1
    if seq_lens.shape[0] < num_seqs or block_tables.shape[0] < num_seqs:
        raise ValueError("seq_lens/block_tables have fewer rows than query_start_loc describes")
    q = q if q.stride(-1) == 1 else q.contiguous()
    block_tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    out = torch.empty_like(q) if out is None else out
    if out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} with a contiguous last dim")
    if not 0 <= first_seq <= num_seqs:
        raise ValueError(f"first_seq {first_seq} is outside [0, {num_seqs}]")
    d_pad = max(16, next_power_of_2(head_dim))
    part_m = part_l = part_acc = out  # not read unless the keys are split
    counters = query_start_loc
    tile_map = tiles is not None
    if tiles is not None:
        if block_m is None:
            raise ValueError("a tile map needs the block_m it was built with")
        if (
            tiles.dim() != 2
            or tiles.shape[0] != TILE_ROWS
            or tiles.dtype != torch.int32
            or tiles.stride(1) != 1
        ):
            raise ValueError(f"tiles must be a [{TILE_ROWS}, N] int32 tensor with contiguous rows")
        if num_tokens == 0 or tiles.shape[1] == 0:
            return out
        grid: tuple[int, ...] = (num_q_heads * tiles.shape[1],)
        tile_stride = tiles.stride(0)
        if split_rows > 0:
            part_m = torch.empty((split_rows, num_q_heads), dtype=torch.float32, device=q.device)
            part_l = torch.empty_like(part_m)
            part_acc = torch.empty((split_rows, num_q_heads, head_dim), dtype=torch.float32, device=q.device)
            counters = merge_counters(q.device, split_rows * num_q_heads)
    else:
        if num_tokens == 0 or num_seqs - first_seq <= 0 or max_query_len <= 0:
            return out
        block_m = prefill_block_m(head_dim, q.dtype, max_query_len, block_m)
        grid = (cdiv(max_query_len, block_m), num_q_heads, num_seqs - first_seq)
        tiles, tile_stride = query_start_loc, 0  # not read
    if prefill_ws.takes_launch(q, k_cache, v_cache, block_m, block_n, cuts_keys=tile_map and split_rows > 0):
        ws_tiles = tiles if tile_map else None
        ws_args = (block_tables, query_start_loc, seq_lens, max_query_len, scale, out, first_seq, ws_tiles)
        return prefill_ws.paged_prefill_attention_ws(q, k_cache, v_cache, *ws_args)
    _, cfg_n, num_warps, num_stages = prefill_config(d_pad, q.dtype, k_cache.dtype, block_m)
    block_n = block_n or cfg_n
    args = (
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out, tiles, part_m, part_l, part_acc,
        counters, scale * LOG2E, q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
        block_tables.stride(0), out.stride(0), out.stride(1), first_seq, tile_stride, num_q_heads,
    )  # fmt: skip
    constexprs = dict(
        GROUP=num_q_heads // num_kv_heads, HEAD_DIM=head_dim, D_PAD=d_pad, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, EVEN_D=d_pad == head_dim, PRECISION=dot_precision(q.dtype),
        DOT_DTYPE=dot_dtype(attention_dot_dtype(q.dtype, k_cache.dtype)), TILE_MAP=tile_map,
        KEY_SPLIT=tile_map and split_rows > 0, num_warps=num_warps if block_m >= 64 else 4, num_stages=num_stages,
    )  # fmt: skip
    launcher.run(grid, args, constexprs)
    return out


def paged_prefill_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
) -> torch.Tensor:
    """Plain torch: per sequence, gather its context through the block table, causal softmax in fp32.

    Rows outside every sequence are left zero.
    """
    del max_query_len
    num_q_heads = q.shape[1]
    group = num_q_heads // k_cache.shape[2]
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i in range(len(starts) - 1):
        s0, s1, n = int(starts[i]), int(starts[i + 1]), int(lens[i])
        q_len = s1 - s0
        if q_len == 0:
            continue
        k, v = gather_sequence_kv(k_cache, v_cache, block_tables[i], n)
        k = k.float().repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = v.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,nhd->hqn", q[s0:s1].float(), k) * scale
        q_pos = torch.arange(n - q_len, n, device=q.device)
        k_pos = torch.arange(n, device=q.device)
        scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[s0:s1] = torch.einsum("hqn,nhd->qhd", probs, v).to(q.dtype)
    return out
