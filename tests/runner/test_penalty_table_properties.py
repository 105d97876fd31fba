"""Mutation audit (runner/penalties.py): the penalty table's rows over a request's life. Every row a finished
request held is free again (an n > 1 request holds one row, not one per sample); rows filled before the table
grows keep their prompt masks; a request with more than one earlier token in flight is refused, not
miscounted. Penalized logits are checked against the plain-Python reference of vLLM v1's rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roseinfer.runner.penalties import PenaltyTable
from roseinfer.sampling_params import SamplingParams
from tests.runner.test_penalties import CPU, VOCAB, reference, request

MAX_ROWS = 64  # the table's cap (max_num_seqs), above every size these tests grow it to


def test_an_n_sample_request_holds_one_row_and_frees_it():
    """The n rows of one prompt share one table row; once the request is released every row is free, so a
    long-running engine does not grow its table by n - 1 rows a request."""
    sp = SamplingParams(temperature=1.0, n=3, presence_penalty=1.0)
    table = PenaltyTable(VOCAB, CPU, MAX_ROWS)
    for i in range(20):
        req = request([1, 2], [3], sp, f"r{i}")
        assert table.step([req, req, req], None) is not None
        assert len(table.slot_of) == 1
        table.release(req.uid)
        assert not table.slot_of
        assert sorted(table.free) == list(range(len(table.counts))), i
    assert len(table.counts) == 8  # the first allocation was never outgrown


def test_rows_filled_before_the_table_grows_keep_their_prompt_and_counts():
    """Eight requests fill the first allocation; a ninth grows it. The first eight still penalize exactly
    their own prompt and output ids afterwards (the repetition penalty reads the prompt mask)."""
    sp = SamplingParams(temperature=0.0, repetition_penalty=2.0, frequency_penalty=0.5)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, VOCAB, 5).tolist() for _ in range(9)]
    outputs = [rng.integers(0, VOCAB, 4).tolist() for _ in range(9)]
    reqs = [request(p, o, sp, f"r{i}") for i, (p, o) in enumerate(zip(prompts, outputs))]
    table = PenaltyTable(VOCAB, CPU, MAX_ROWS)
    table.step(reqs[:8], None)
    assert len(table.counts) == 8
    table.step(reqs[8:], None)
    assert len(table.counts) > 8
    pen = table.step(reqs, None)
    assert pen is not None
    logits = torch.from_numpy(rng.normal(0.0, 2.0, (9, VOCAB)).astype(np.float32)) + 0.5
    got = pen.apply(logits.clone())
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        want = reference(logits[i].tolist(), p, o, 0.0, 0.5, 2.0)
        np.testing.assert_allclose(got[i].numpy(), np.array(want, np.float32), rtol=1e-6, atol=1e-6)


def test_more_than_one_earlier_token_in_flight_is_refused():
    """Async scheduling keeps at most one earlier token in flight; a row filled with more would miss the
    tokens it cannot read (only the previous step's sampled tokens are on hand), so it is an error."""
    sp = SamplingParams(temperature=0.0, frequency_penalty=1.0)
    req = request([1], [4], sp)
    req.num_pending, req.pending_row = 3, 0
    with pytest.raises(RuntimeError, match="more than one earlier token in flight"):
        PenaltyTable(VOCAB, CPU, MAX_ROWS).step([req], torch.tensor([5], dtype=torch.int32))
