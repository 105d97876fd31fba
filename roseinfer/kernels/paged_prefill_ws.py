"""Paged prefill attention for long chunks on Hopper, warp-specialised (Gluon): the LONG_TILE launches
(`prefill_plan.LONG_TILE`, 128 query rows of one head a program, 128-key tiles, D=128) whose keys are not cut.

The Triton kernel (`paged_prefill_attention.py`) runs these at ~350 TFLOP/s on an H200, where FA3 runs ~570: its
8 warps load K/V, wait on the tensor cores and run the softmax in lockstep, so each waits on the others at every
tile. Here a program is three partitions:
- a loader warp copies each key tile's pages by TMA through the block table into a 2-slot K ring and a 3-slot V
  ring, each slot with a ready and an empty mbarrier;
- two consumer warp groups, 64 query rows each, run the online softmax. Each issues tile j+1's QK^T wgmma
  before tile j's softmax and tile j's PV wgmma after it, so the tensor cores work through the softmax; a
  group frees a slot on its empty barrier once its wgmma that read it is done.

The last key tile may run past the context into the rest of its page, which holds whatever the cache had there:
warp group 0 zeroes those V rows before either group's last PV (a zero weight would not cancel an inf).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from roseinfer.kernels._common import LOG2E, cdiv, is_interpret
from roseinfer.kernels.direct_launch import DirectLaunch, variant_key

BLOCK_M = gl.constexpr(128)
BLOCK_N = gl.constexpr(128)
HEAD_DIM = gl.constexpr(128)
GROUP_ROWS = gl.constexpr(64)  # query rows of one consumer warp group
V_SLOTS = gl.constexpr(3)  # with two, V loads waited on the softmax: 1.3x slower (H200)
CONSUMER_REGS = gl.constexpr(240)
SWIZZLE_COLS = 64  # halves in the 128-byte swizzle of the K/V rings: a TMA box's width
# The rings' layout (what get_default_for picks for 64-half rows), and a TMA box's. Built here, not passed in:
# Triton's compile hooks serialise a kernel's constexprs as JSON, which a layout object is not.
RING_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
BOX_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3))
ENABLED = True  # False: every launch takes the Triton kernel (A/B runs)
HALF_DTYPES = (torch.bfloat16, torch.float16)


@gluon.jit
def _softmax_step(s, m_i, l_i, n0, q_pos, qk_scale, CAUSAL: gl.constexpr, s_layout: gl.constexpr):
    """Tile weights p (unnormalised), the running max's rescale alpha, and the new running max and sum."""
    if CAUSAL:
        n = n0 + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout))
        s = gl.where(n[None, :] <= q_pos[:, None], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        p = gl.exp2(s - m_new[:, None])
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _load_tile(desc, bt_row, tile, kv_end, col, bar, smem, PAGES: gl.constexpr):
    """Key tile `tile`'s pages into `smem` ([PAGES * page, HEAD_DIM]) by TMA, done on `bar`: a box a half-row page
    (the 128-byte swizzle's width), whose place in `smem` is one contiguous run."""
    page: gl.constexpr = desc.block_type.shape[1]
    half: gl.constexpr = desc.block_type.shape[2]
    idx_layout: gl.constexpr = gl.BlockedLayout([PAGES], [32], [1], [0])
    i = gl.arange(0, PAGES, layout=idx_layout)
    blocks = gl.load(bt_row + tile * PAGES + i, mask=(tile * PAGES + i) * page < kv_end, other=0)
    mbarrier.expect(bar, PAGES * (HEAD_DIM // half) * desc.block_type.nbytes)
    for p in gl.static_range(PAGES):
        block = gl.sum(gl.where(i == p, blocks, 0), axis=0)
        for c in gl.static_range(HEAD_DIM // half):
            run = smem.slice(p * page, page).slice(c * half, half, dim=1)
            dst = run._reinterpret(smem.dtype, desc.block_type.shape, BOX_LAYOUT)
            tma.async_copy_global_to_shared(desc, [block, 0, col + c * half], bar, dst)


@gluon.jit
def _loader(k_desc, v_desc, rings, bars, bt_row, kv_end, num_tiles, col, PAGES: gl.constexpr):
    _, k_smem, v_smem = rings
    k_ready, k_empty, v_ready, v_empty, _ = bars
    for t in range(num_tiles):
        # A slot's first fill waits on the phase before its barrier's first, which counts as complete.
        mbarrier.wait(k_empty.index(t % 2), ((t // 2) & 1) ^ 1)
        _load_tile(k_desc, bt_row, t, kv_end, col, k_ready.index(t % 2), k_smem.index(t % 2), PAGES)
        v = t % V_SLOTS
        mbarrier.wait(v_empty.index(v), ((t // V_SLOTS) & 1) ^ 1)
        _load_tile(v_desc, bt_row, t, kv_end, col, v_ready.index(v), v_smem.index(v), PAGES)


@gluon.jit
def _zero_tail(v_last, first_key, kv_end, PAGE: gl.constexpr):
    """Zero the rows of a V tile (keys first_key...) at or past kv_end, a page at a time."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    for p in gl.static_range(v_last.shape[0] // PAGE):
        chunk = v_last.slice(p * PAGE, PAGE)
        n = first_key + p * PAGE + gl.arange(0, PAGE, layout=gl.SliceLayout(1, layout))
        chunk.store(gl.where((n < kv_end)[:, None], chunk.load(layout), 0.0))


@gluon.jit
def _consumer(WG: gl.constexpr, q_ptr, out_ptr, qk_scale, rings, bars, tile, strides, PAGE: gl.constexpr):
    """Query rows m0 + 64 WG ... of the program's tile. rings: the Q, K, V shared buffers; bars: K ready/empty,
    V ready/empty and the zeroed-tail barrier; tile: its sequence's position and its key tiles."""
    q_smem, k_smem, v_smem = rings
    k_ready, k_empty, v_ready, v_empty, v_fixed = bars
    q_start, q_len, prefix, m0, head, kv_end, full_tiles, num_tiles = tile
    stride_qt, stride_qh, stride_ot, stride_oh = strides
    ROWS: gl.constexpr = GROUP_ROWS
    D: gl.constexpr = HEAD_DIM
    N: gl.constexpr = BLOCK_N
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    r0 = m0 + WG * ROWS

    d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    rows = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, ld))
    tok = (q_start + rows).to(gl.int64)
    q = gl.load(
        q_ptr + tok[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=(rows < q_len)[:, None],
        other=0.0,
    )
    q_w = q_smem.index(WG)
    q_w.store(q)
    fence_async_shared()
    gl.thread_barrier()  # this warp group's
    q_pos = prefix + r0 + gl.arange(0, ROWS, layout=row_s)

    s_zero = gl.zeros([ROWS, N], gl.float32, s_layout)
    mbarrier.wait(k_ready.index(0), 0)
    s_cur = warpgroup_mma(q_w, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s_cur = warpgroup_mma_wait(0, deps=(s_cur,))
    mbarrier.arrive(k_empty.index(0), count=1)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([ROWS], gl.float32, row_s)
    acc = warpgroup_mma_init(gl.zeros([ROWS, D], gl.float32, o_layout))
    for j in range(0, num_tiles - 1):
        mbarrier.wait(k_ready.index((j + 1) % 2), ((j + 1) // 2) & 1)
        s_next = warpgroup_mma(
            q_w, k_smem.index((j + 1) % 2).permute((1, 0)), s_zero, use_acc=False, is_async=True
        )
        if j >= full_tiles:
            p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, j * N, q_pos, qk_scale, True, s_layout)
        else:
            p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, j * N, q_pos, qk_scale, False, s_layout)
        acc = warpgroup_mma_wait(1, deps=(acc,))  # tile j-1's PV: its V slot is free
        mbarrier.arrive(v_empty.index((j + V_SLOTS - 1) % V_SLOTS), count=1, pred=j > 0)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(v_ready.index(j % V_SLOTS), (j // V_SLOTS) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(j % V_SLOTS), acc, is_async=True)
        s_cur = warpgroup_mma_wait(1, deps=(s_next,))  # tile j+1's QK^T: its K slot is free
        mbarrier.arrive(k_empty.index((j + 1) % 2), count=1)

    j = num_tiles - 1
    p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, j * N, q_pos, qk_scale, True, s_layout)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    mbarrier.wait(v_ready.index(j % V_SLOTS), (j // V_SLOTS) & 1)
    v_last = v_smem.index(j % V_SLOTS)
    if (j + 1) * N > kv_end:
        if WG == 0:
            _zero_tail(v_last, j * N, kv_end, PAGE)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(v_fixed.index(0), count=1)
        else:
            mbarrier.wait(v_fixed.index(0), 0)
    acc = warpgroup_mma(p_op, v_last, acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc,))

    o = acc / gl.convert_layout(l_i, row_o)[:, None]
    rows_o = r0 + gl.arange(0, ROWS, layout=row_o)
    d_o = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    tok_o = (q_start + rows_o).to(gl.int64)
    gl.store(
        out_ptr + tok_o[:, None] * stride_ot + head * stride_oh + d_o[None, :],
        o.to(dtype),
        mask=(rows_o < q_len)[:, None],
    )


@gluon.jit(do_not_specialize=["first_seq", "tile_stride", "stride_btb"])
def _prefill_ws_kernel(
    q_ptr,
    k_desc,
    v_desc,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    tile_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_btb,
    stride_ot,
    stride_oh,
    first_seq,
    tile_stride,
    num_q_heads,
    GROUP: gl.constexpr,
    BLOCK_M: gl.constexpr,
    TILE_MAP: gl.constexpr,
    num_warps: gl.constexpr,
):
    gl.static_assert(BLOCK_M == 2 * GROUP_ROWS and num_warps == 4)
    PAGE: gl.constexpr = k_desc.block_type.shape[1]
    PAGES: gl.constexpr = BLOCK_N // PAGE
    if TILE_MAP:  # as `_prefill_kernel`'s: heads vary fastest, -1 marks a spare program
        pid = gl.program_id(0)
        head = pid % num_q_heads
        entry = pid // num_q_heads
        b = gl.load(tile_ptr + entry)
        if b < 0:
            return
        m_block = gl.load(tile_ptr + tile_stride + entry)
    else:
        head = gl.program_id(1)
        m_block = gl.num_programs(0) - 1 - gl.program_id(0)
        b = gl.program_id(2) + first_seq
    col = (head // GROUP) * HEAD_DIM
    q_start = gl.load(query_start_loc_ptr + b)
    q_len = gl.load(query_start_loc_ptr + b + 1) - q_start
    prefix = gl.load(seq_lens_ptr + b) - q_len
    m0 = m_block * BLOCK_M
    if m0 >= q_len:
        return
    full_tiles = (prefix + m0 + 1) // BLOCK_N  # key tiles every row of the q tile sees whole
    kv_end = prefix + gl.minimum(m0 + BLOCK_M, q_len)
    num_tiles = gl.cdiv(kv_end, BLOCK_N)
    bt_row = block_tables_ptr + b.to(gl.int64) * stride_btb

    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_smem = gl.allocate_shared_memory(dtype, [2, GROUP_ROWS, HEAD_DIM], RING_LAYOUT)
    k_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HEAD_DIM], RING_LAYOUT)
    v_smem = gl.allocate_shared_memory(dtype, [V_SLOTS, BLOCK_N, HEAD_DIM], RING_LAYOUT)
    k_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [V_SLOTS, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [V_SLOTS, 1], mbarrier.MBarrierLayout())
    v_fixed = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # both warp groups
    for i in gl.static_range(V_SLOTS):
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)
    mbarrier.init(v_fixed.index(0), count=1)
    fence_async_shared()
    rings = (q_smem, k_smem, v_smem)
    bars = (k_ready, k_empty, v_ready, v_empty, v_fixed)
    tile = (q_start, q_len, prefix, m0, head, kv_end, full_tiles, num_tiles)
    strides = (stride_qt, stride_qh, stride_ot, stride_oh)
    gl.warp_specialize([
        (_consumer, (0, q_ptr, out_ptr, qk_scale, rings, bars, tile, strides, PAGE)),
        (_consumer, (1, q_ptr, out_ptr, qk_scale, rings, bars, tile, strides, PAGE)),
        (_loader, (k_desc, v_desc, rings, bars, bt_row, kv_end, num_tiles, col, PAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])  # fmt: skip


@functools.cache
def _is_hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def runs_on(
    device: torch.device, dtype: torch.dtype, cache_dtype: torch.dtype, head_dim: int, block_size: int
) -> bool:
    """Whether this kernel runs LONG_TILE's uncut launches on `device` at these dtypes and shapes: a Hopper GPU
    (wgmma), D=128, half-precision queries over a cache of their dtype, pages of 16-128 slots."""
    if not ENABLED or is_interpret() or device.type != "cuda" or not _is_hopper(device.index or 0):
        return False
    pages = (16, 32, 64, 128)  # pages that divide the key tile
    return dtype in HALF_DTYPES and cache_dtype == dtype and head_dim == HEAD_DIM and block_size in pages


def takes_launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_m: int,
    block_n: int | None,
    cuts_keys: bool,
) -> bool:
    """Whether this kernel runs a prefill launch: LONG_TILE's (128 x 128) whose keys are not cut, where `runs_on`,
    with K/V rows TMA can address (a slot's heads contiguous, 16-byte aligned)."""
    if block_m != BLOCK_M or block_n not in (None, BLOCK_N) or cuts_keys or v_cache.dtype != k_cache.dtype:
        return False
    block_size, _, head_dim = k_cache.shape[1:]
    return runs_on(q.device, q.dtype, k_cache.dtype, head_dim, block_size) and all(
        c.stride(3) == 1
        and c.stride(2) == head_dim
        and c.stride(0) % 8 == 0
        and c.stride(1) % 8 == 0
        and c.data_ptr() % 16 == 0
        for c in (k_cache, v_cache)
    )


class _PageView(NamedTuple):
    """What the compiled launcher reads of a `_page_descriptor` to encode its TMA descriptor, without
    TensorDescriptor's checks (run on a launch key's first call; `takes_launch` checks alignment on every call)."""

    base: torch.Tensor
    shape: list[int]
    strides: list[int]
    padding: str = "zero"


def _page_view(cache: torch.Tensor) -> _PageView:
    """A [num_blocks, block_size, heads x D] view of one layer's cache."""
    num_blocks, block_size, heads, head_dim = cache.shape
    return _PageView(cache, [num_blocks, block_size, heads * head_dim], [cache.stride(0), cache.stride(1), 1])


def _page_descriptor(cache: torch.Tensor) -> TensorDescriptor:
    """`_page_view` as a descriptor whose box is one page of half a KV head."""
    view = _page_view(cache)
    return TensorDescriptor(
        view.base, view.shape, view.strides, [1, cache.shape[1], SWIZZLE_COLS], BOX_LAYOUT.value
    )


launcher = DirectLaunch(_prefill_ws_kernel)


def paged_prefill_attention_ws(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
    out: torch.Tensor,
    first_seq: int = 0,
    tiles: torch.Tensor | None = None,
) -> torch.Tensor:
    """`paged_prefill_attention` where `takes_launch`: the plain grid, or a tile map (built at BLOCK_M) whose keys
    are not cut. Arguments as there, already checked."""
    num_q_heads = q.shape[1]
    if tiles is not None:
        grid: tuple[int, ...] = (num_q_heads * tiles.shape[1],)
        tile_ptr, tile_stride = tiles, tiles.stride(0)
    else:
        grid = (cdiv(max_query_len, BLOCK_M), num_q_heads, query_start_loc.shape[0] - 1 - first_seq)
        tile_ptr, tile_stride = query_start_loc, 0  # not read
    specialised = (q.stride(0), q.stride(1), out.stride(0), out.stride(1), num_q_heads)
    unspecialised = (block_tables.stride(0), first_seq, tile_stride, k_cache.stride(0), v_cache.stride(0))
    pointers = (q, block_tables, query_start_loc, seq_lens, out, tile_ptr)
    key = (
        variant_key(pointers, specialised, unspecialised),
        k_cache.dtype,
        k_cache.shape[1:],
        tiles is not None,
    )
    rest = (block_tables, query_start_loc, seq_lens, out, tile_ptr, scale * LOG2E, q.stride(0), q.stride(1),
            block_tables.stride(0), out.stride(0), out.stride(1), first_seq, tile_stride, num_q_heads)  # fmt: skip
    launcher(
        key,
        grid,
        (q, _page_view(k_cache), _page_view(v_cache), *rest),
        launch_constants(num_q_heads, k_cache.shape[2], tiles is not None),
        lambda: (q, _page_descriptor(k_cache), _page_descriptor(v_cache), *rest),
    )
    return out


def launch_constants(num_q_heads: int, num_kv_heads: int, tile_map: bool) -> dict[str, int | bool]:
    """The kernel's constexprs and warps: plain values, as Triton's compile hooks serialise them to JSON."""
    return {
        "GROUP": num_q_heads // num_kv_heads,
        "BLOCK_M": BLOCK_M.value,
        "TILE_MAP": tile_map,
        "num_warps": 4,
    }
