"""Mutation audit (runner/cuda_graphs.py), on the GPU: a decode graph draws each temperature row with its own seed
(`seed + row`). Sixteen rows with the same input id, position, context and block table get bit-identical logits
(checked), so only their seeds can set their draws apart; the same seed repeats them, another one moves them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roseinfer.runner.inputs import HostStep
from tests.gpu.conftest import fp32_triton_engine, free_gpu

pytestmark = pytest.mark.gpu

ROWS = 16


def identical_rows() -> HostStep:
    i32 = np.int32
    return HostStep(
        input_ids=np.full(ROWS, 5, i32),
        positions=np.full(ROWS, 20, i32),
        slot_mapping=np.full(ROWS, -1, i32),  # nothing written: every row reads the same context
        query_start_loc=np.arange(ROWS + 1, dtype=i32),
        seq_lens=np.full(ROWS, 21, i32),
        block_tables=np.tile(np.array([[0, 1]], i32), (ROWS, 1)),
        max_query_len=1,
        logits_index=np.arange(ROWS, dtype=i32),
    )


@pytest.fixture(autouse=True)
def _release_engines():
    yield
    free_gpu()


def test_decode_graph_rows_draw_with_their_own_seeds_on_gpu(llama_dir):
    llm = fp32_triton_engine(llama_dir, False, num_kv_blocks=64, max_num_seqs=ROWS)
    runner = llm.engine.core.runner
    assert runner.graphs is not None and runner.kv_cache is not None
    torch.manual_seed(0)
    runner.kv_cache.normal_()
    step = identical_rows()
    assert runner.graphs.can_run(step)
    hot = np.ones(ROWS, np.float32)

    graphs = runner.graphs

    def draw(seed: int) -> tuple[torch.Tensor, list[int]]:
        logits, tokens = graphs.run(step, None, hot, seed)
        assert tokens is not None
        out = logits.clone(), tokens.tolist()
        torch.cuda.synchronize()
        return out

    logits, first = draw(1234)
    assert all(torch.equal(logits[0], logits[i]) for i in range(ROWS))  # the rows differ only by seed
    assert len(set(first)) > 1, first  # sixteen rows, one seed each: not all one token
    assert draw(1234)[1] == first  # the same seeds draw the same tokens
    assert draw(99)[1] != first
    # Greedy rows (no temperatures) take the argmax of those logits.
    _, greedy = graphs.run(step, None)
    assert greedy is not None and greedy.tolist() == [int(logits[0].argmax())] * ROWS
