"""Paged decode attention: one query token per sequence over the sequence's KV blocks (split-K flash-decoding).

Program (b, kv_head, split) walks a contiguous, BLOCK_N-aligned share of sequence b's keys, loads each K/V
tile once and serves all `num_heads // num_kv_heads` query heads of that kv head with one `tl.dot` (the
query heads are padded to a tile of at least 16 rows). With one split it normalises and writes the output.
With several, each program writes a partial (running max, running sum, unnormalised accumulator) and takes
a ticket; the last of a (sequence, kv head)'s programs to finish merges the partials, so there is no second
launch.

Given the step's new token (`NewTokenKV`), the kernel also does what a separate rotary + KV-store launch
would: it rotates q and the new k in registers, attends to the new token from them, and writes its K/V to
the cache slot. A decode step is then one launch per layer. With a `DeferredNorm` it also finishes the
qkv projection (1 / rms of the row before the layer's norm, and the bias), so the norm needs no launch.

Programs run in the order (kv head, row, split): a sequence's kv heads read its blocks side by side. Given
an `order` (the rows by length, longest first), row r serves sequence `order[r]`: the long sequences start
first and the short ones fill the tail, where in row order a long one started late would finish alone.

The split boundaries come from `seq_lens` on the device, so the launch depends only on shapes and
`num_splits` (CUDA-graph safe); `num_splits` only changes how the work is cut, never the result.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roseinfer.kernels import paged_decode_split as launch
from roseinfer.kernels._common import (
    LOG2E,
    attention_dot_dtype,
    check_paged_cache,
    dot_dtype,
    dot_precision,
    gather_sequence_kv,
    next_power_of_2,
)
from roseinfer.kernels.decode_kv_tile import attend_tile, load_kv_rows, load_tile_blocks
from roseinfer.kernels.decode_new_token import (
    NewTokenKV,
    attend_new_token,
    check_new_kv,
    neox_cos_sin,
    rotate_neox,
)
from roseinfer.kernels.decode_split_merge import finish_split, gpu_split
from roseinfer.kernels.direct_launch import DirectLaunch
from roseinfer.kernels.pdl import pdl_kwargs, wait_for_producer
from roseinfer.kernels.rmsnorm import row_chunk, row_inv_rms, scale_by_inv_rms

MIN_KEYS = tl.constexpr(launch.MIN_KEYS_PER_SPLIT)


@triton.jit(do_not_specialize=["num_splits", "stride_btb"])  # both vary per step: no variant per value
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    counters_ptr,
    k_new_ptr,
    v_new_ptr,
    slot_ptr,
    pos_ptr,
    cos_sin_ptr,
    x_ptr,
    bias_ptr,
    order_ptr,
    qk_scale,
    num_q_heads,
    num_kv_heads,
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
    stride_knb,
    stride_knh,
    stride_vnb,
    stride_vnh,
    stride_xb,
    hidden,
    eps,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    APPEND: tl.constexpr,
    ROPE: tl.constexpr,
    DEFERRED_NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    X_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    SPLITS_CHUNK: tl.constexpr,
    HAS_ORDER: tl.constexpr,
    GPU_SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PDL: tl.constexpr,
):
    kvh = tl.program_id(0)
    split = tl.program_id(2)
    b = tl.program_id(1)
    if GPU_SPLIT:  # slot_ptr (else read with APPEND only): the live count; num_splits: programs to aim for
        b, part_row, split, num_splits, serves = gpu_split(
            tl.program_id(1), kvh, order_ptr, seq_lens_ptr, slot_ptr, out_ptr, stride_ob, stride_oh,
            num_kv_heads, num_splits, GROUP, GROUP_PAD, HEAD_DIM, D_PAD, SPLITS_PAD, MIN_KEYS,
        )  # fmt: skip
    elif HAS_ORDER:
        b = tl.load(order_ptr + b)
    b64 = b.to(tl.int64)

    seq_len = tl.load(seq_lens_ptr + b)
    if GPU_SPLIT:
        seq_len = tl.where(serves, seq_len, 0)
        part_row = part_row.to(tl.int64)
    else:
        part_row = b64
    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, seq_len)
    # With APPEND the last key (index seq_len - 1) is the step's own token: it comes from k_new/v_new, not
    # from the cache, and the program whose share holds that index writes it into the cache.
    cached_end = tl.minimum(end, seq_len - 1) if APPEND else end
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D_PAD)
    heads = kvh * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    q_mask = g_mask[:, None] & d_mask[None, :]
    # Offsets of q's, the kv head's k's and v's bias in the fused qkv bias (used with DEFERRED_NORM).
    q_bias = heads[:, None] * HEAD_DIM
    k_bias = (num_q_heads + kvh) * HEAD_DIM
    v_bias = (num_q_heads + num_kv_heads + kvh) * HEAD_DIM
    bt_row = block_tables_ptr + b64 * stride_btb
    k_base = k_cache_ptr + kvh * stride_kh
    v_base = v_cache_ptr + kvh * stride_vh

    # Up to the wait, read only the step's inputs and what launches at least two back wrote (x, the layer's
    # input): under PDL those are final once this launch may start (kernels/pdl.py).
    inv_rms = 1.0
    if DEFERRED_NORM:
        inv_rms = row_inv_rms(x_ptr + b64 * stride_xb, hidden, eps, X_CHUNK)
    if ROPE:
        pos = tl.load(pos_ptr + b).to(tl.int64)
        partner, cos, sin = neox_cos_sin(pos, cos_sin_ptr, d, d_mask, HEAD_DIM)
    else:
        pos = 0
    # With one split every program holds its sequence's own token: with pos and slot read now, the token's
    # loads after the last tile are one round trip, and at head_dim 128 the kernel takes 128 registers instead
    # of 136 (4 programs an SM, not 3). With several, only one program in num_splits has it, and reading them
    # late measured as fast.
    if APPEND and not SPLIT:
        slot = tl.load(slot_ptr + b64).to(tl.int64)
    # The first tile's block-table entries, and in the loop each next tile's: a tile's K/V loads then go out
    # without a block-table round trip before them (where ncu put 43% of the stall samples at qwen b=64).
    blks = load_tile_blocks(start, cached_end, bt_row, BLOCK_SIZE, BLOCK_N)
    wait_for_producer(PDL)

    q_rows = q_ptr + b64 * stride_qb + heads[:, None] * stride_qh
    q = tl.load(q_rows + d[None, :], mask=q_mask, other=0.0)
    if DEFERRED_NORM:
        q = scale_by_inv_rms(q, inv_rms, bias_ptr + q_bias + d[None, :], q_mask, HAS_BIAS)
    if ROPE:
        q_partner = tl.load(q_rows + partner[None, :], mask=q_mask, other=0.0)
        if DEFERRED_NORM:
            q_partner = scale_by_inv_rms(
                q_partner, inv_rms, bias_ptr + q_bias + partner[None, :], q_mask, HAS_BIAS
            )
        q = rotate_neox(q, q_partner, cos[None, :], sin[None, :])
    if DOT_DTYPE == tl.float16:  # bf16 queries over an fp8 cache (`attention_dot_dtype`)
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0)
    q = q.to(DOT_DTYPE)

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], dtype=tl.float32)
    for n0 in range(start, cached_end, BLOCK_N):
        k, v, n_mask = load_kv_rows(
            blks, n0, cached_end, k_base, v_base, d, d_mask, stride_kb, stride_ks, stride_vb, stride_vs,
            BLOCK_SIZE, BLOCK_N,
        )  # fmt: skip
        k = k.to(DOT_DTYPE)  # an fp8 cache's K/V widened (a no-op for a cache of the dots' type)
        v = v.to(DOT_DTYPE)
        blks = load_tile_blocks(n0 + BLOCK_N, cached_end, bt_row, BLOCK_SIZE, BLOCK_N)
        m_i, l_i, acc = attend_tile(q, k, v, n_mask, m_i, l_i, acc, qk_scale, PRECISION, DOT_DTYPE)

    if APPEND:
        own = seq_len - 1
        if (own >= start) & (own < end):
            if SPLIT:
                if ROPE:
                    pos = tl.load(pos_ptr + b).to(tl.int64)
                slot = tl.load(slot_ptr + b64).to(tl.int64)
            m_i, l_i, acc = attend_new_token(
                q,
                m_i,
                l_i,
                acc,
                qk_scale,
                inv_rms,
                d,
                d_mask,
                k_new_ptr + b64 * stride_knb + kvh * stride_knh,
                v_new_ptr + b64 * stride_vnb + kvh * stride_vnh,
                bias_ptr + k_bias,
                bias_ptr + v_bias,
                pos,
                cos_sin_ptr,
                slot,
                k_base,
                v_base,
                stride_kb,
                stride_ks,
                stride_vb,
                stride_vs,
                HEAD_DIM,
                BLOCK_SIZE,
                ROPE,
                DEFERRED_NORM,
                HAS_BIAS,
            )

    o_rows = out_ptr + b64 * stride_ob + heads[:, None] * stride_oh + d[None, :]
    out_dtype = out_ptr.dtype.element_ty
    if GPU_SPLIT:
        whole = serves & (num_splits == 1)
        merge = serves & (num_splits > 1)
    else:  # annotated: a plain assignment would make them tensors, and these ifs runtime ones
        whole: tl.constexpr = not SPLIT
        merge: tl.constexpr = SPLIT
    if whole:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(o_rows, out.to(out_dtype), mask=q_mask)
    if merge:
        # Partials are [B, Hq, num_splits] (m, l) and [B, Hq, num_splits, HEAD_DIM] (acc), contiguous.
        finish_split(
            m_i,
            l_i,
            acc,
            split,
            (part_row * num_q_heads + heads) * num_splits,
            g_mask,
            d,
            d_mask,
            o_rows,
            out_ptr,
            part_m_ptr,
            part_l_ptr,
            part_acc_ptr,
            counters_ptr + b64 * num_kv_heads + kvh,
            num_splits,
            GROUP_PAD,
            D_PAD,
            HEAD_DIM,
            SPLITS_PAD,
            SPLITS_CHUNK,
        )


launcher = DirectLaunch(_decode_kernel)


def paged_decode_attention(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    new_kv: NewTokenKV | None = None,
    order: torch.Tensor | None = None,
    pdl: bool = False,
    live: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its `seq_lens[b]` keys; returns [B, Hq, D].

    Without `new_kv` every key is read from the cache. With it, key `seq_lens[b] - 1` is the sequence's
    new token: taken from `new_kv` (rotated with q when it carries `rope`) and written to its cache slot
    by the kernel. A sequence of length 0 gets a zero output. `num_splits=None` picks a split count from
    the batch shape and the block table's capacity; pass it explicitly (e.g. from `choose_num_splits` with
    the step's max_seq_len) to control it. `order` [B] int32, a permutation of the rows, sets the order in
    which they are served (`decode_order`); it never changes the result. `pdl`: launch with programmatic
    dependent launch (`kernels/pdl.py`), reading q, the new token and the deferred norm's rows only once the
    kernel before has finished. `live` [1] int32 on the device: only rows order[0..live) are served, each cut
    into splits the GPU picks from `live` as `choose_num_splits` would (a CUDA graph's replay then splits as its
    step needs); the other rows get zero outputs. It takes an `order` (longest first) and no `new_kv`.
    """
    block_size, num_kv_heads, head_dim = check_paged_cache(k_cache, v_cache, q.dtype)
    batch, num_q_heads, _ = q.shape
    launch.check_rows(q, head_dim, num_kv_heads, seq_lens, block_tables, order, live, new_kv is not None)
    q = q if q.stride(-1) == 1 else q.contiguous()
    block_tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} with a contiguous last dim")
    if new_kv is not None:
        check_new_kv(new_kv, batch, num_q_heads, num_kv_heads, head_dim)
    if batch == 0:
        return out

    group = num_q_heads // num_kv_heads
    d_pad = max(16, next_power_of_2(head_dim))
    group_pad = max(16, next_power_of_2(group))
    if live is not None:
        num_splits = 1  # the grid's; each program takes its own from `live`
    elif num_splits is None:
        num_splits = launch.choose_num_splits(
            batch, num_kv_heads, block_tables.shape[1] * block_size, q.device
        )
    num_splits = max(1, int(num_splits))
    splits_pad = next_power_of_2(num_splits) if live is None else launch.MAX_SPLITS
    block_n, num_warps, num_stages = launch.decode_config(d_pad, q.dtype, k_cache.dtype)
    split = num_splits > 1 or live is not None
    if split:  # with `live`: a row's splits take the slots of the launch's own programs (at most batch)
        part_m, part_l, part_acc, counters = launch.split_workspace(
            batch, num_q_heads, num_kv_heads, num_splits, head_dim, q.device
        )
    else:
        part_m = part_l = part_acc = counters = out  # unused
    k_new, v_new = (new_kv.k, new_kv.v) if new_kv is not None else (q, q)
    slots = new_kv.slot_mapping if new_kv is not None else live if live is not None else seq_lens
    rope = new_kv.rope if new_kv is not None else None
    positions, cos_sin = rope if rope is not None else (seq_lens, out)
    norm = new_kv.norm if new_kv is not None else None
    x = norm.x if norm is not None else out
    bias = norm.bias if norm is not None and norm.bias is not None else out
    hidden = x.shape[-1]

    # A sequence's kv heads are neighbours in the launch order, so they read its blocks together.
    args = (
        q, k_cache, v_cache, block_tables, seq_lens, out, part_m, part_l, part_acc, counters,
        k_new, v_new, slots, positions, cos_sin, x, bias, order if order is not None else seq_lens,
        scale * LOG2E, num_q_heads, num_kv_heads,
        num_splits if live is None else launch.target_programs(q.device),
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
        block_tables.stride(0), out.stride(0), out.stride(1),
        k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
        x.stride(0), hidden, norm.eps if norm is not None else 0.0,
    )  # fmt: skip
    constexprs = dict(
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, D_PAD=d_pad, BLOCK_SIZE=block_size, BLOCK_N=block_n,
        APPEND=new_kv is not None, ROPE=rope is not None, DEFERRED_NORM=norm is not None,
        HAS_BIAS=norm is not None and norm.bias is not None, X_CHUNK=row_chunk(hidden),
        SPLIT=split, SPLITS_PAD=splits_pad, SPLITS_CHUNK=min(splits_pad, max(1, 4096 // (group_pad * d_pad))),
        HAS_ORDER=order is not None, GPU_SPLIT=live is not None,
        PRECISION=dot_precision(q.dtype), DOT_DTYPE=dot_dtype(attention_dot_dtype(q.dtype, k_cache.dtype)),
        **pdl_kwargs(pdl),
        num_warps=num_warps, num_stages=num_stages,
        **launch.launch_options(d_pad, q.dtype, norm is not None),
    )  # fmt: skip
    launcher.run((num_kv_heads, batch, num_splits), args, constexprs)
    return out


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
