"""Mutation audit (runner/cuda_graphs.py): the decode graphs' host-side bookkeeping, on the CPU. Each "graph" is a
stand-in whose replay runs the graphs' own body over their buffers with a forward that records what it was given,
so what a replay would feed the model (padded batch, pending ids, padding rows, temperatures, seeds) and which
steps may replay at all are checked against the step, computed here in plain Python."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.runner.cuda_graphs import DecodeGraphs, graph_batch_sizes
from roseinfer.runner.inputs import HostStep

CPU = torch.device("cpu")
VOCAB = 8
WIDTH = 3  # the captured block-table width
BLOCK = 4


class Forward:
    """What a replay's forward was given; each row's "logits" hold its input id, and its "token" is id + 100."""

    def __init__(self) -> None:
        self.calls: list[dict[str, np.ndarray]] = []

    def __call__(self, ids, positions, meta: AttentionMetadata, temperature, seeds, tokens) -> torch.Tensor:
        self.calls.append(
            {
                "ids": ids.numpy().copy(),
                "positions": positions.numpy().copy(),
                "slots": meta.slot_mapping.numpy().copy(),
                "seq_lens": meta.seq_lens.numpy().copy(),
                "tables": meta.block_tables.numpy().copy(),
                "temperature": temperature.numpy().copy(),
                "seeds": seeds.numpy().copy(),
            }
        )
        tokens.copy_(ids + 100)
        return ids.float().unsqueeze(1).expand(len(ids), VOCAB).clone()


class Replay:
    def __init__(self, graphs: DecodeGraphs, size: int, replayed: list[int]) -> None:
        self.graphs, self.size, self.replayed = graphs, size, replayed
        self.out = torch.zeros(size, VOCAB)

    def replay(self) -> None:
        self.out.copy_(self.graphs.body(self.size, self.graphs._meta(self.size)))
        self.replayed.append(self.size)


def graphs(max_batch: int) -> tuple[DecodeGraphs, Forward, list[int]]:
    forward, replayed = Forward(), []
    g = DecodeGraphs(forward, CPU, max_batch, WIDTH, BLOCK)
    stand_ins = {s: Replay(g, s, replayed) for s in g.sizes}
    g.graphs = {s: (r, r.out) for s, r in stand_ins.items()}
    return g, forward, replayed


def decode_step(
    b: int,
    width: int = WIDTH,
    fill: dict[int, int] | None = None,
    logits_index: list[int] | None = None,
) -> HostStep:
    """`b` decodes; row i has id 10 + i, position 20 + i, slot 30 + i, length 5 + i, blocks 40 + i, 41 + i, ...;
    `fill`: input row -> the previous step's row whose token it takes."""
    i32 = np.int32
    fill = fill or {}
    ids = np.array([0 if i in fill else 10 + i for i in range(b)], i32)
    rows = np.arange(b, dtype=i32)
    return HostStep(
        input_ids=ids,
        positions=rows + 20,
        slot_mapping=rows + 30,
        query_start_loc=np.arange(b + 1, dtype=i32),
        seq_lens=rows + 5,
        block_tables=(40 + rows[:, None] + np.arange(width, dtype=i32)[None, :]).astype(i32),
        max_query_len=1,
        fill_index=np.array(list(fill), i32),
        fill_row=np.array(list(fill.values()), i32),
        logits_index=np.array(range(b) if logits_index is None else logits_index, i32),
    )


@pytest.mark.parametrize("max_batch", [1, 3, 8, 20, 33, 256, 300, 512, 1000, 1024, 1025, 1500, 2048])
def test_each_batch_replays_a_graph_only_a_little_larger(max_batch):
    """Sizes rise strictly to `max_batch` itself, and every batch of 1..max_batch rows finds a size that pads it
    by less than itself and less than 32 rows (the padding is wasted work on every layer)."""
    sizes = graph_batch_sizes(max_batch)
    assert sizes[-1] == max_batch and sizes[0] == 1
    assert all(a < b for a, b in zip(sizes, sizes[1:]))
    for b in range(1, max_batch + 1):
        size = min(s for s in sizes if s >= b)
        assert size - b < min(b, 32), (b, size)


def test_which_steps_may_replay():
    g, _, _ = graphs(8)
    assert g.can_run(decode_step(8))  # a full batch at the captured width
    assert not g.can_run(decode_step(9))
    assert not g.can_run(decode_step(2, width=WIDTH + 1))  # a graph never reads past its block table
    assert g.can_run(decode_step(2, width=1))
    assert g.can_run(decode_step(2, fill={0: 7, 1: 3}))  # pending ids from the previous step's rows < 8
    assert not g.can_run(decode_step(2, fill={0: 8}))
    assert not g.can_run(decode_step(4, logits_index=[0, 0, 1, 1, 2, 2, 3, 3, 3]))  # 9 sampled rows
    assert g.can_run(decode_step(4, logits_index=[0, 0, 1, 1, 2, 2, 3, 3]))
    prefill = decode_step(2)
    prefill.max_query_len = 2
    assert not g.can_run(prefill)
    empty, _, _ = graphs(8)
    empty.graphs = {}  # not captured
    assert not empty.can_run(decode_step(1))


def test_each_step_replays_the_smallest_graph_that_holds_it():
    g, forward, replayed = graphs(16)
    for b in range(1, 17):
        g.run(decode_step(b), None)
        assert replayed[-1] == min(s for s in g.sizes if s >= b)
        fed = forward.calls[-1]
        assert fed["ids"][:b].tolist() == [10 + i for i in range(b)]
        assert fed["positions"][:b].tolist() == [20 + i for i in range(b)]
        assert fed["slots"][:b].tolist() == [30 + i for i in range(b)]
        assert fed["seq_lens"][:b].tolist() == [5 + i for i in range(b)]
        assert fed["tables"][:b].tolist() == decode_step(b).block_tables.tolist()


def test_padding_rows_write_no_kv():
    """A batch of 5 replays the graph of 8: its 3 padding rows must write no KV (slot -1), whatever the earlier,
    larger step left in the buffer."""
    g, forward, _ = graphs(8)
    g.run(decode_step(8), None)
    g.run(decode_step(5), None)
    assert forward.calls[-1]["slots"].tolist() == [30, 31, 32, 33, 34, -1, -1, -1]


@pytest.mark.parametrize("max_batch", [8, 16])  # 16: the rows fill their aligned stride exactly
def test_pending_ids_come_from_the_previous_step_and_touch_no_other_row(max_batch):
    """Rows 1 and 3 of 5 take the previous step's tokens of its rows 2 and 0 (sampled outside the graphs, in a
    longer step than the graphs hold); every other row keeps its own id, padding included."""
    g, forward, _ = graphs(max_batch)
    prev = torch.arange(500, 500 + max_batch + 4, dtype=torch.int32)  # a step with more rows than a graph
    g.run(decode_step(5, fill={1: 2, 3: 0}), prev)
    assert forward.calls[-1]["ids"][:5].tolist() == [10, 502, 12, 500, 14]
    assert (forward.calls[-1]["ids"][5:] == 0).all()
    # The next step feeds from the graph's own tokens of that replay (its ids + 100).
    g.run(decode_step(2, fill={0: 1, 1: 3}), g.tokens[:5])
    assert forward.calls[-1]["ids"][:2].tolist() == [602, 600]


def test_a_step_without_pending_ids_ignores_stale_fill_entries():
    g, forward, _ = graphs(8)
    g.run(decode_step(4, fill={0: 1, 2: 3}), torch.arange(700, 708, dtype=torch.int32))
    g.run(decode_step(4), None)
    assert forward.calls[-1]["ids"][:4].tolist() == [10, 11, 12, 13]


def test_temperatures_and_seeds_of_the_replay():
    g, forward, _ = graphs(8)
    hot = np.array([0.5, 0.0, 2.0], np.float32)
    g.run(decode_step(3), None, hot, seed=1000)
    fed = forward.calls[-1]
    assert fed["temperature"][:3].tolist() == hot.tolist()
    assert (fed["temperature"][3:] == 0).all()
    assert fed["seeds"][:3].tolist() == [1000, 1001, 1002]  # each row its own seed
    # All greedy (on each of the two host buffers the graphs alternate): no earlier temperature may remain.
    for _ in range(2):
        g.run(decode_step(3), None)
        assert (forward.calls[-1]["temperature"] == 0).all()
    with pytest.raises(ValueError, match="temperatures"):
        g.run(decode_step(3), None, np.ones(2, np.float32))


def test_the_sampled_rows_logits_and_the_graphs_tokens():
    g, _, _ = graphs(8)
    logits, tokens = g.run(decode_step(3), None)
    assert logits[:, 0].tolist() == [10, 11, 12]
    assert tokens is not None and tokens.tolist() == [110, 111, 112]
    # Row 1 samples twice and row 0 not at all: the rows are gathered, and the graph's tokens do not apply.
    logits, tokens = g.run(decode_step(3, logits_index=[1, 1, 2]), None)
    assert logits[:, 0].tolist() == [11, 11, 12] and tokens is None
    logits, tokens = g.run(decode_step(3, logits_index=[2, 1]), None)
    assert logits[:, 0].tolist() == [12, 11] and tokens is None
