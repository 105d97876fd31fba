"""Launch planning for paged prefill attention, on the host: the tile shape, and the tile map that gives a
CUDA graph's replay a grid fixed whatever the step holds."""

from __future__ import annotations

import numpy as np
import torch
import triton

from roseinfer.kernels._common import is_interpret


def prefill_config(head_dim_pad: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages)."""
    if is_interpret():
        return 16, 16, 4, 1
    if dtype == torch.float32:
        return 64, 32, 4, 2
    # Swept on H100 (bf16, 4 x 2k tokens, block size 16): ~250 TFLOP/s at D=64, ~305 at D=128.
    if head_dim_pad <= 64:
        return 64, 64, 4, 2
    if head_dim_pad <= 128:
        return 128, 32, 8, 2
    return 64, 32, 8, 2


def prefill_block_m(head_dim: int, dtype: torch.dtype, max_query_len: int, block_m: int | None = None) -> int:
    """The q tile height for chunks of up to `max_query_len` tokens: short chunks (mixed batches of decodes
    and small prefills) would waste most of a big tile."""
    d_pad = max(16, triton.next_power_of_2(head_dim))
    block_m = block_m or prefill_config(d_pad, dtype)[0]
    return max(16, min(block_m, triton.next_power_of_2(max(1, max_query_len))))


def prefill_tile_map(
    query_start_loc: np.ndarray, seq_lens: np.ndarray, first_seq: int, block_m: int, capacity: int
) -> np.ndarray:
    """[2, capacity] int32: the (sequence, q tile) each program of a tile-map launch takes, for sequences
    `first_seq..`; the tiles with the most keys first, so the launch ends on short programs; -1 pads."""
    q_lens = np.diff(query_start_loc.astype(np.int64))[first_seq:]
    counts = -(-q_lens // block_m)
    total = int(counts.sum())
    if total > capacity:
        raise ValueError(f"{total} q tiles exceed the tile map's {capacity}")
    seq = np.repeat(np.arange(first_seq, first_seq + len(q_lens)), counts)
    block = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    prefix = seq_lens[first_seq:].astype(np.int64) - q_lens
    keys = np.repeat(prefix, counts) + np.minimum((block + 1) * block_m, np.repeat(q_lens, counts))
    order = np.argsort(-keys, kind="stable")
    tiles = np.full((2, capacity), -1, np.int32)
    tiles[0, :total] = seq[order]
    tiles[1, :total] = block[order]
    return tiles
