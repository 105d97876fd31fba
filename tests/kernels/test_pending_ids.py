"""The pending-id scatter (`kernels/pending_ids.py`) against torch's indexing."""

from __future__ import annotations

import pytest
import torch

from roseinfer.kernels.pending_ids import BLOCK, scatter_pending, scatter_pending_ref
from tests.kernels.kernel_utils import DEVICE, generator


@pytest.mark.parametrize("prev_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(("rows", "fills"), [(1, 1), (9, 4), (64, 64), (BLOCK + 40, BLOCK + 3)])
def test_scatter_matches_indexing(rows, fills, prev_dtype):
    """Distinct targets, sources read in any order and more than once, padding entries that all write one
    scratch row (as the graphs pad), and more fills than one program takes."""
    gen = generator("pending", rows, fills, prev_dtype)
    ids = torch.randint(0, 50_000, (rows + 1,), generator=gen, dtype=torch.int32).to(DEVICE)
    real = min(fills, rows)
    fill_index = torch.cat([torch.randperm(rows, generator=gen)[:real], torch.full((fills - real,), rows)])
    fill_row = torch.randint(0, 7, (fills,), generator=gen)
    fill_row[real:] = 0  # padding: the scratch row gets prev[0] from each
    prev = torch.randint(0, 2**31 - 1, (7,), generator=gen).to(prev_dtype)
    args = [t.to(torch.int32).to(DEVICE) for t in (fill_index, fill_row)] + [prev.to(DEVICE)]
    want = ids.clone()
    scatter_pending_ref(want, *args)
    scatter_pending(ids, *args)
    assert torch.equal(ids, want)


def test_nothing_to_fill_and_mismatched_lengths():
    ids = torch.arange(5, dtype=torch.int32, device=DEVICE)
    empty = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    scatter_pending(ids, empty, empty, ids)
    assert ids.tolist() == list(range(5))
    with pytest.raises(ValueError, match="fill rows"):
        scatter_pending(ids, ids[:2], ids[:3], ids)
