"""Mutation audit (runner/mixed_graphs.py): which steps with prefill work a mixed-step graph holds, and what a
replay feeds the forward (padded tokens and sequences, pending ids, the tile map, the sampled rows), on the CPU
with stand-in replays that run the graphs' own body over their buffers; expectations computed here."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.kernels import paged_prefill_ws, prefill_plan
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
                "block_m": meta.tile_block_m,
                "split_rows": meta.split_rows,
            }
        )
        return ids.float().unsqueeze(1).expand(len(ids), HIDDEN).clone()


class Replay:
    def __init__(self, graphs: MixedGraphs, size: int, long: bool = False) -> None:
        self.graphs, self.size, self.long = graphs, size, long
        self.out = torch.zeros(size, HIDDEN)

    def replay(self) -> None:
        self.out.copy_(self.graphs.body(self.size, self.graphs._meta(self.size, self.long)))


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
    """At llama-3.1-8b's heads on a GPU without the warp-specialised kernel, a 1024-token chunk over 9216 cached
    tokens takes LONG_TILE, which the graphs (captured at the 64-row tile, no twins) do not hold: it runs eagerly.
    The same chunk fresh stays in a graph."""
    monkeypatch.setattr(prefill_plan, "is_interpret", lambda: False)
    monkeypatch.setattr(prefill_plan, "num_sms", lambda device: 132)
    g = MixedGraphs(Forward(), CPU, 1040, MAX_SEQS, 700, 16, 32, 128, torch.bfloat16, 2)
    g.graphs = {s: (None, None) for s in g.sizes}
    assert g.long_sizes == [] and g.long_tiles == {}  # runs_on: not on a CPU device
    fresh = step([1, 1024], width=700)
    assert size_of(g, fresh) == 1040 and g.block_m[1040] == 64
    over_prefix = replace(fresh, seq_lens=np.array([50, 1024 + 9216], np.int32))
    assert size_of(g, over_prefix) is None
    assert size_of(g, replace(fresh, seq_lens=np.array([50, 1024 + 1023], np.int32))) == 1040


def long_graphs(monkeypatch: pytest.MonkeyPatch, num_heads: int = 32) -> tuple[MixedGraphs, Forward]:
    """Graphs up to 1040 tokens as on a Hopper GPU of 132 SMs (the warp-specialised kernel runs LONG_TILE's uncut
    maps there), at `num_heads` query heads of 128; each from 256 tokens on with a twin; replays on the CPU."""
    monkeypatch.setattr(prefill_plan, "is_interpret", lambda: False)
    monkeypatch.setattr(prefill_plan, "num_sms", lambda device: 132)
    monkeypatch.setattr(paged_prefill_ws, "runs_on", lambda *args: True)
    forward = Forward()
    g = MixedGraphs(forward, CPU, 1040, MAX_SEQS, 700, 16, num_heads, 128, torch.bfloat16, 2)
    g.graphs = {s: (r, r.out) for s, r in ((s, Replay(g, s)) for s in g.sizes)}
    g.long_graphs = {s: (r, r.out) for s, r in ((s, Replay(g, s, long=True)) for s in g.long_sizes)}
    return g, forward


def over(q_lens: list[int], prefixes: list[int]) -> HostStep:
    """A step of chunks `q_lens` over `prefixes` cached tokens each (a prefix of 0 with one token: a decode)."""
    return replace(
        step(q_lens, width=700), seq_lens=np.array(q_lens, np.int32) + np.array(prefixes, np.int32)
    )


def test_chunks_over_long_prefixes_replay_the_long_tile_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    """From 256 tokens on, each graph has a twin at LONG_TILE's tile (`long_sizes`), whose map cuts no key. A step
    replays it where its chunks over long prefixes pay for it, in the graph of the step's padded size, fed the
    128-row map at the twin's capacity without partials; it replays the 64-row graph otherwise."""
    g, forward = long_graphs(monkeypatch)
    assert g.long_sizes == [s for s in g.sizes if s >= 256] and g.long_sizes[0] == 256
    assert g.long_tiles[576] == 576 // 128 + 1 + 2  # q tiles, one more per chunk (two), no split entries
    cases = {  # (q_lens, prefixes) -> (size, long)
        ((1, 512), (49, 1024)): (576, True),  # the 64-row map's 8 tiles x 32 heads cut no key
        ((1, 512), (49, 0)): (576, False),  # fresh
        ((1, 256), (49, 4096)): (320, False),  # the 64-row map cuts its keys (checked below)
        ((300, 300, 300), (700, 700, 700)): (960, False),  # 128-row tiles 78% full
        ((256, 256, 256), (1000, 1000, 1000)): (768, True),
        ((1, 1024), (49, 9216)): (1040, True),  # LONG_TILE pays; its 8 tiles x 32 heads fill a wave
        ((1, 1024), (49, 0)): (1040, False),
    }
    for (q_lens, prefixes), (size, long) in cases.items():
        s = over(list(q_lens), list(prefixes))
        plan = g.plan(s)
        assert plan is not None and (plan.size, plan.long) == (size, long), (q_lens, prefixes, plan)
        hidden = g.run(s, plan, None)
        fed = forward.calls[-1]
        n = plan.tiles.shape[1]
        assert fed["block_m"] == (128 if long else 64) and (fed["split_rows"] == 0) == long
        assert fed["tiles"].shape[1] == (g.long_tiles if long else g.num_tiles)[size] == n
        assert (fed["tiles"] == plan.tiles).all()
        if long:  # every 128-row q tile of the chunks once, uncut
            chunks = np.array(q_lens[1:] if q_lens[0] == 1 else q_lens)
            assert int((plan.tiles[0] >= 0).sum()) == int((-(-chunks // 128)).sum())
            assert (plan.tiles[3] <= 1).all()
        assert hidden[:, 0].tolist() == [9 + e for e in np.cumsum(q_lens)]  # each sequence's last token
    cut = g.plan(over([1, 256], [49, 4096]))
    assert cut is not None and (cut.tiles[3] > 1).any()
    assert g.num_graphs() == len(g.sizes) + len(g.long_sizes)


def test_a_long_tile_step_whose_eager_map_would_cut_keys_replays_the_64_row_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At 4 heads, LONG_TILE's 8 q tiles of a 1024-token chunk over 9216 cached tokens leave most of a wave free:
    its eager map would cut their keys, which the twin (a map that cuts none) cannot, so the step replays the 64-row
    graph, whose map cuts them (an eager step of a model this small is host-bound). At 16 heads the same tiles
    leave too little of the wave to cut, and the step replays the twin. The graph rule's chunk at 4 heads cuts its
    64-row map's keys, and replays the 64-row graph."""
    g, _ = long_graphs(monkeypatch, num_heads=4)
    for q_lens, prefixes, size in (([1, 1024], [49, 9216], 1040), ([1, 512], [49, 1024], 576)):
        plan = g.plan(over(q_lens, prefixes))
        assert plan is not None and not plan.long and plan.size == size, (q_lens, plan)
        assert (plan.tiles[3] > 1).any()
    # At qwen3-0.6b's 16 heads a 1024-token chunk's 8 tiles fill 128 of the wave's 132 programs, and no cut fits in
    # the other 4: its eager map cuts no key, so it replays the twin. A 768-token chunk's 6 tiles leave room to cut.
    g16, _ = long_graphs(monkeypatch, num_heads=16)
    for prefix in (1024, 4096, 9216):
        plan = g16.plan(over([1, 1024], [49, prefix]))
        assert plan is not None and plan.long and plan.size == 1040, prefix
    plan = g16.plan(over([1, 768], [49, 768]))
    assert (
        plan is not None and not plan.long and plan.size == 832 and plan.tiles.shape[1] == g16.num_tiles[832]
    )
    g32, _ = long_graphs(monkeypatch)  # twins not captured: the rule's steps keep the 64-row graph
    g32.long_graphs = {}
    plan = g32.plan(over([1, 512], [49, 1024]))
    assert plan is not None and not plan.long and plan.size == 576
    assert g32.plan(over([1, 1024], [49, 9216])) is None
