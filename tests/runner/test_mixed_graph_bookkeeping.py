"""Mutation audit (runner/mixed_graphs.py): which steps with prefill work a mixed-step graph holds, and what a
replay feeds the forward (padded tokens and sequences, pending ids, the tile map, the sampled rows), on the CPU
with stand-in replays that run the graphs' own body over their buffers; expectations computed here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.runner.inputs import HostStep
from roseinfer.runner.mixed_graphs import MixedGraphs

CPU = torch.device("cpu")
HIDDEN = 4
WIDTH = 3
MAX_SEQS = 4


class Forward:
    """Records what a replay's forward was given; each row's "hidden state" holds its input id."""

    def __init__(self) -> None:
        self.calls: list[dict[str, np.ndarray]] = []

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        assert (
            meta.prefill_tiles is not None
            and meta.decode_seq_lens is not None
            and meta.decode_count is not None
        )
        self.calls.append(
            {
                "ids": ids.numpy().copy(),
                "slots": meta.slot_mapping.numpy().copy(),
                "query_start_loc": meta.query_start_loc.numpy().copy(),
                "decode_seq_lens": meta.decode_seq_lens.numpy().copy(),
                "decode_count": meta.decode_count.numpy().copy(),
                "tiles": meta.prefill_tiles.numpy().copy(),
            }
        )
        return ids.float().unsqueeze(1).expand(len(ids), HIDDEN).clone()


class Replay:
    def __init__(self, graphs: MixedGraphs, size: int) -> None:
        self.graphs, self.size = graphs, size
        self.out = torch.zeros(size, HIDDEN)

    def replay(self) -> None:
        self.out.copy_(self.graphs.body(self.size, self.graphs._meta(self.size)))


def graphs(max_tokens: int = 32, max_chunks: int = 2) -> tuple[MixedGraphs, Forward]:
    forward = Forward()
    g = MixedGraphs(
        forward, CPU, max_tokens, MAX_SEQS, WIDTH, 4, 2, 16, torch.float32, max_chunks, key_splits=False
    )
    stand_ins = {s: Replay(g, s) for s in g.sizes}
    g.graphs = {s: (r, r.out) for s, r in stand_ins.items()}
    return g, forward


def step(
    q_lens: list[int],
    width: int = 2,
    fill: dict[int, int] | None = None,
    logits_index: list[int] | None = None,
) -> HostStep:
    """Sequences with `q_lens` new tokens over 3 earlier ones each; token r has id 10 + r and slot 100 + r;
    `fill`: token row -> the previous step's row whose token it takes."""
    i32 = np.int32
    fill = fill or {}
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(i32)
    t, b = int(qsl[-1]), len(q_lens)
    return HostStep(
        input_ids=np.array([0 if r in fill else 10 + r for r in range(t)], i32),
        positions=np.arange(t, dtype=i32),
        slot_mapping=np.arange(100, 100 + t, dtype=i32),
        query_start_loc=qsl,
        seq_lens=np.array(q_lens, i32) + 3,
        block_tables=np.zeros((b, width), i32),
        max_query_len=max(q_lens),
        fill_index=np.array(list(fill), i32),
        fill_row=np.array(list(fill.values()), i32),
        logits_index=(qsl[1:] - 1).astype(i32) if logits_index is None else np.array(logits_index, i32),
    )


def size_of(g: MixedGraphs, s: HostStep) -> int | None:
    plan = g.plan(s)
    return None if plan is None else plan.size


def test_which_steps_a_graph_holds():
    g, _ = graphs()
    assert g.sizes == [16, 32]
    assert size_of(g, step([16])) == 16  # a step of exactly a graph's tokens
    assert size_of(g, step([1, 16])) == 32
    assert size_of(g, step([30, 2])) == 32  # exactly the largest graph's tokens
    assert size_of(g, step([31, 2])) is None
    assert size_of(g, step([1, 1, 1, 5])) == 16  # as many sequences as the graph holds
    assert size_of(g, step([1, 1, 5], logits_index=[0, 1, 6, 6, 6])) is None  # 5 sampled rows > 4
    assert size_of(g, step([1, 1, 5], logits_index=[0, 1, 6, 6])) == 16
    assert size_of(g, step([2, 5], width=WIDTH)) == 16  # the captured block-table width
    assert size_of(g, step([2, 5], width=WIDTH + 1)) is None
    assert size_of(g, step([1, 5], fill={0: MAX_SEQS - 1})) == 16  # pending ids of the previous step's rows
    assert size_of(g, step([1, 5], fill={0: MAX_SEQS})) is None
    # 16 tokens hold one 16-row q tile plus one per prompt chunk, for two chunks: three tiles.
    assert size_of(g, step([2, 2, 2])) == 16
    assert size_of(g, step([2, 2, 2, 2])) is None
    assert size_of(g, step([1, 1])) is None  # decodes only: the decode graphs' step
    empty, _ = graphs()
    empty.graphs = {}
    assert empty.plan(step([2, 5])) is None


def run(g: MixedGraphs, s: HostStep, prev: torch.Tensor | None = None) -> torch.Tensor:
    plan = g.plan(s)
    assert plan is not None
    return g.run(s, plan, prev)


def test_a_replay_feeds_the_step_and_pads_the_rest():
    g, forward = graphs()
    for _ in range(2):  # 16 tokens, three decodes, in both host buffers the graphs alternate
        run(g, step([1, 1, 1, 13]))
    s = step([1, 5])
    for _ in range(2):
        hidden = run(g, s)
        fed = forward.calls[-1]
        assert fed["ids"][:6].tolist() == [10 + r for r in range(6)]
        assert fed["slots"].tolist() == [100 + r for r in range(6)] + [-1] * 10  # padding writes no KV
        assert fed["query_start_loc"].tolist() == [0, 1, 6, 6, 6]  # padding sequences: no new tokens
        assert fed["decode_seq_lens"].tolist() == [4, 0, 0, 0]  # the one leading decode, 3 earlier tokens + 1
        assert fed["decode_count"].tolist() == [
            1
        ]  # the decode kernel's live rows (after three in the step before)
        plan = g.plan(s)
        assert plan is not None
        n = plan.tiles.shape[1]
        assert (fed["tiles"][:, :n] == plan.tiles).all()
        assert hidden[:, 0].tolist() == [10, 15]  # each sequence's last token


def test_sampled_rows_are_gathered_in_their_order():
    g, _ = graphs()
    hidden = run(g, step([1, 5], logits_index=[5, 0, 5]))
    assert hidden[:, 0].tolist() == [15, 10, 15]


@pytest.mark.parametrize("prev_len", [2, MAX_SEQS + 3])
def test_pending_ids_come_from_the_previous_step_and_touch_no_other_row(prev_len: int):
    g, forward = graphs()
    run(g, step([1, 1, 5], fill={0: 1, 1: 0}), torch.arange(500, 500 + prev_len, dtype=torch.int32))
    assert forward.calls[-1]["ids"][:7].tolist() == [501, 500, 12, 13, 14, 15, 16]
    assert (forward.calls[-1]["ids"][7:] == 0).all()
    run(g, step([1, 5]))  # nothing pending: stale fill entries of the step before must not apply
    assert forward.calls[-1]["ids"][:6].tolist() == [10 + r for r in range(6)]


def test_a_step_that_pays_for_the_long_tile_runs_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    """At llama-3.1-8b's heads on a GPU, a 1024-token chunk over 9216 cached tokens takes LONG_TILE, which the
    graphs (captured at the 64-row tile) do not hold: it runs eagerly. The same chunk fresh stays in a graph."""
    from dataclasses import replace

    from roseinfer.kernels import prefill_plan

    monkeypatch.setattr(prefill_plan, "is_interpret", lambda: False)
    monkeypatch.setattr(prefill_plan, "num_sms", lambda device: 132)
    g = MixedGraphs(Forward(), CPU, 1040, MAX_SEQS, 700, 16, 32, 128, torch.bfloat16, 2)
    g.graphs = {s: (None, None) for s in g.sizes}
    fresh = step([1, 1024], width=700)
    assert size_of(g, fresh) == 1040 and g.block_m[1040] == 64
    over_prefix = replace(fresh, seq_lens=np.array([50, 1024 + 9216], np.int32))
    assert size_of(g, over_prefix) is None
    assert size_of(g, replace(fresh, seq_lens=np.array([50, 1024 + 1023], np.int32))) == 1040
