"""LONG_TILE, the 128 x 128 prefill tile of long chunks, against the plain-torch reference on a GPU (the
interpreter runs the 16-row tile only): through the plain grid and the planner's eager map."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from roseinfer.kernels.prefill_plan import LONG_CHUNK_TOKENS, LONG_TILE, TilePlanner  # noqa: E402
from tests.kernels.kernel_utils import DEVICE, DTYPE_IDS  # noqa: E402
from tests.kernels.test_paged_prefill_attention import _run, _run_tile_map  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(32, 8), (8, 8)], ids=["llama8b", "mha8"])
@pytest.mark.parametrize("block_size", [16, 64])
def test_prefill_long_chunks_take_the_long_tile_gpu(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int, block_size: int
) -> None:
    """LONG_TILE (128 x 128, 8 warps) at D=128: chunks of LONG_CHUNK_TOKENS or more over long odd prefixes,
    past block and tile boundaries, beside short chunks and decodes; through the plain grid and through the
    map the planner gives such an eager step (whose keys it cuts at 8 heads; at 32 it launches the kernel
    without the merge)."""
    q_lens = [LONG_CHUNK_TOKENS, 1, 1537, 70, 2047]
    prefix_lens = [9215, 5000, 0, 3001, 129]
    _run(
        q_lens, prefix_lens, block_size, num_heads, num_kv_heads, 128, dtype, "long", LONG_TILE[0], pad_rows=3
    )
    planner = TilePlanner(num_heads, 128, dtype, DEVICE)
    q_lens, prefix_lens = [1, 1, LONG_CHUNK_TOKENS], [700, 33, 20_001]
    starts = np.concatenate([[0], np.cumsum(q_lens)])
    planned = planner.eager_map(starts, np.add(q_lens, prefix_lens))
    assert planned is not None and planned[1] == LONG_TILE[0]
    tiles = _run_tile_map(
        q_lens, prefix_lens, num_heads, num_kv_heads, 128, dtype, LONG_TILE[0], 2, spare=planner.split_entries,
        block_size=block_size, pad_rows=2, split=planner.long_split, eager=True,
    )  # fmt: skip
    assert (tiles[:, : planned[0].shape[1]] == planned[0]).all()
    assert num_heads > 8 or (tiles[3] > 1).any(), "no tile's keys were cut"
