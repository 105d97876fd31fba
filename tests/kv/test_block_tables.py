"""The KV manager's block-table mirror (`kv/block_tables.py`) against plain lists, under random changes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from roseinfer.kv.block_tables import BlockTables
from roseinfer.request import Request
from roseinfer.sampling_params import SamplingParams


@pytest.mark.parametrize("seed", range(6))
def test_rows_follow_the_block_lists_through_growth_and_reuse(seed: int) -> None:
    rng = random.Random(seed)
    tables = BlockTables(rows=2, width=4)  # small: rows and width both have to grow
    reqs = [Request(str(i), [1], SamplingParams()) for i in range(12)]
    for _ in range(400):
        req = rng.choice(reqs)
        op = rng.random()
        if op < 0.5:  # append blocks
            new = [rng.randrange(1, 1000) for _ in range(rng.randint(0, 9))]
            tables.write(req, len(req.block_ids), new)
            req.block_ids.extend(new)
        elif op < 0.75 and req.block_ids:  # replace one (a copy-on-write)
            i = rng.randrange(len(req.block_ids))
            req.block_ids[i] = rng.randrange(1, 1000)
            tables.set(req, i, req.block_ids[i])
        else:  # free
            tables.release(req, len(req.block_ids))
            req.block_ids = []
            assert req.table_row == -1
        tables.check(reqs)
        holders = [r for r in reqs if r.table_row >= 0]
        if holders:
            rows = np.array([r.table_row for r in holders])
            width = max(len(r.block_ids) for r in holders)
            got = tables.gather(rows, width)
            for r, row in zip(holders, got, strict=True):
                assert row.tolist() == r.block_ids + [0] * (width - len(r.block_ids))
    for r in reqs:
        tables.release(r, len(r.block_ids))
        r.block_ids = []
    assert tables.rows_in_use == 0 and not tables.array.any()


def test_check_catches_a_stale_row() -> None:
    tables = BlockTables(rows=2, width=2)
    req = Request("a", [1], SamplingParams())
    req.block_ids = [5, 6, 7]
    tables.write(req, 0, req.block_ids)
    tables.check([req])
    req.block_ids[1] = 9  # changed without telling the mirror
    with pytest.raises(AssertionError, match="block-table row"):
        tables.check([req])
