"""`build_host_step` against a plain-Python, token-by-token reference of what each field means
(`runner/inputs.py`, `attention/metadata.py`): random batches of decodes, prompt chunks, pending tokens (async
scheduling) and n > 1 samples, with block tables from the requests' lists or from the KV manager's mirror."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from roseinfer.kv.block_tables import BlockTables
from roseinfer.runner.inputs import Staging, build_host_step, fill_pending, upload_step
from roseinfer.scheduler.scheduler import ScheduledRequest, SchedulerOutput


def random_batch(rng: random.Random, block_size: int, decode_only: bool) -> list[ScheduledRequest]:
    sched = []
    for _ in range(rng.randint(1, 6)):
        start = rng.randint(0, 40)
        new = 1 if decode_only else rng.choice([1, rng.randint(1, 12)])
        pending = rng.random() < 0.4  # the last new token was sampled by the step in flight
        known = start + new - 1 if pending else rng.randint(start + new, start + new + 3)
        tokens = [rng.randint(1, 999) for _ in range(known)]
        blocks = rng.sample(range(1, 500), -(-(start + new) // block_size))
        request = SimpleNamespace(
            all_token_ids=tokens, block_ids=blocks, pending_row=rng.randint(0, 7), table_row=-1
        )
        samples = rng.choice([0, 1, 1, 1, 3]) if not pending else 1
        sched.append(ScheduledRequest(request, new, samples, start=start))  # type: ignore[arg-type]
    return sched


def reference(sched: list[ScheduledRequest], block_size: int) -> dict[str, list]:
    ref: dict[str, list] = {
        k: [] for k in ("ids", "pos", "slots", "qsl", "seq_lens", "fill_index", "fill_row")
    }
    ref |= {"logits_index": [], "sample_rows": [], "tables": []}
    ref["qsl"].append(0)
    width = max(len(s.request.block_ids) for s in sched)
    for i, s in enumerate(sched):
        r = s.request
        for p in range(s.start, s.start + s.num_new_tokens):
            ref["ids"].append(r.all_token_ids[p] if p < len(r.all_token_ids) else 0)
            ref["pos"].append(p)
            ref["slots"].append(r.block_ids[p // block_size] * block_size + p % block_size)
        last_row = len(ref["ids"]) - 1
        ref["qsl"].append(len(ref["ids"]))
        ref["seq_lens"].append(s.start + s.num_new_tokens)
        if s.start + s.num_new_tokens > len(r.all_token_ids):
            ref["fill_index"].append(last_row)
            ref["fill_row"].append(r.pending_row)
        ref["logits_index"] += [last_row] * s.num_samples
        ref["sample_rows"] += [i] * s.num_samples
        ref["tables"].append(r.block_ids + [0] * (width - len(r.block_ids)))
    return ref


@pytest.mark.parametrize("mirror", [False, True], ids=["lists", "mirror"])
@pytest.mark.parametrize("seed", range(40))
def test_host_step_matches_the_reference(seed: int, mirror: bool) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    sched = random_batch(rng, block_size, decode_only=seed % 3 == 0)
    tables = None
    if mirror:
        tables = BlockTables(rows=2, width=2)  # grows as requests get rows
        for s in rng.sample(sched, len(sched)):  # rows in another order than the batch's
            tables.write(s.request, 0, s.request.block_ids)
    step = build_host_step(SchedulerOutput(sched, tables=tables), block_size)
    ref = reference(sched, block_size)
    got = {
        "ids": step.input_ids,
        "pos": step.positions,
        "slots": step.slot_mapping,
        "qsl": step.query_start_loc,
        "seq_lens": step.seq_lens,
        "fill_index": step.fill_index,
        "fill_row": step.fill_row,
        "logits_index": step.logits_index,
        "sample_rows": step.sample_rows,
        "tables": step.block_tables,
    }
    for name, want in ref.items():
        np.testing.assert_array_equal(
            got[name], np.array(want, np.int32).reshape(got[name].shape), err_msg=name
        )
        assert len(got[name]) == len(want), name
    assert step.max_query_len == max(s.num_new_tokens for s in sched)
    assert step.one_sample_each == all(s.num_samples == 1 for s in sched)


def test_a_scheduled_request_without_a_mirror_row_is_refused() -> None:
    """Gathering row -1 of the mirror would read another request's blocks (the last row): refused instead."""
    tables = BlockTables(rows=4, width=4)
    held = SimpleNamespace(all_token_ids=[1, 2, 3], block_ids=[7], pending_row=0, table_row=-1)
    tables.write(held, 0, [7])
    stray = SimpleNamespace(all_token_ids=[4, 5], block_ids=[9], pending_row=0, table_row=-1)
    out = SchedulerOutput(
        [ScheduledRequest(held, 3, 1), ScheduledRequest(stray, 2, 1)],  # type: ignore[arg-type]
        tables=tables,
    )
    with pytest.raises(RuntimeError, match="block-table row"):
        build_host_step(out, block_size=4)


@pytest.mark.parametrize("seed", range(12))
def test_uploaded_step_carries_the_host_step_and_fills_pending_ids(seed: int) -> None:
    """upload_step: the device views equal the host arrays, the metadata's maxima are the batch's, and each
    pending input id is the previous step's sampled token of its request's row."""
    rng = random.Random(seed)
    sched = random_batch(rng, 4, decode_only=seed % 2 == 0)
    step = build_host_step(SchedulerOutput(sched), 4)
    prev = torch.tensor([rng.randint(1000, 2000) for _ in range(8)])
    ids, pos, meta, logits_index = upload_step(step, Staging(torch.device("cpu"), capacity=16), prev)
    want_ids = step.input_ids.copy()
    for s, row in zip(sched, np.cumsum([s.num_new_tokens for s in sched]) - 1, strict=True):
        if s.start + s.num_new_tokens > len(s.request.all_token_ids):
            want_ids[row] = int(prev[s.request.pending_row])
    np.testing.assert_array_equal(ids.numpy(), want_ids)
    np.testing.assert_array_equal(pos.numpy(), step.positions)
    np.testing.assert_array_equal(logits_index.numpy(), step.logits_index)
    np.testing.assert_array_equal(meta.slot_mapping.numpy(), step.slot_mapping)
    np.testing.assert_array_equal(meta.block_tables.numpy(), step.block_tables)
    assert meta.seq_lens.tolist() == meta.seq_lens_cpu == [s.start + s.num_new_tokens for s in sched]
    assert meta.query_start_loc.tolist() == meta.query_start_loc_cpu == step.query_start_loc.tolist()
    assert meta.max_seq_len == max(s.start + s.num_new_tokens for s in sched)
    assert meta.max_query_len == max(s.num_new_tokens for s in sched)


def test_pending_ids_without_an_earlier_step_are_refused() -> None:
    ids = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="pending"):
        fill_pending(ids, torch.tensor([2], dtype=torch.int32), torch.tensor([0], dtype=torch.int32), None)
