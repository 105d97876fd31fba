"""`DecodeGraphs.run` and `MixedGraphs.run` on the CPU: each captured "graph" is a stand-in whose replay runs
the graphs' own body (pending fill, forward, and for decode graphs sampling) on the graph buffers, so the
real graph path (one input buffer, padding, row gathering, in-graph sampling) is exercised without CUDA."""

from __future__ import annotations

import numpy as np
import torch

from roseinfer.runner.cuda_graphs import DecodeGraphs
from roseinfer.runner.mixed_graphs import MixedGraphs


def assert_longest_first(order: torch.Tensor, seq_lens: torch.Tensor) -> bool:
    """The decode kernel's rows in a graph's buffer: each row once, the sequences longest first. Returns
    whether the order differs from row order."""
    rows, lens = order.numpy(), seq_lens.numpy()
    assert sorted(rows.tolist()) == list(range(len(rows))), f"not a permutation of the rows: {rows}"
    assert (np.diff(lens[rows]) <= 0).all(), f"rows {rows} of lengths {lens} are not longest first"
    return bool((rows != np.arange(len(rows))).any())


class CpuReplay:
    def __init__(self, graphs: DecodeGraphs, runner, size: int) -> None:
        self.graphs, self.runner, self.size = graphs, runner, size
        self.logits = torch.zeros(size, runner.cfg.vocab_size)
        self.replays = 0
        self.reordered = 0  # replays whose decode rows were not served in row order

    def replay(self) -> None:
        g, n = self.graphs, self.size
        meta = g._meta(n)  # the torch backend reads the host copies the graphs leave as placeholders
        meta.seq_lens_cpu = g.seq_lens[:n].tolist()
        meta.max_seq_len = max(meta.seq_lens_cpu)
        self.reordered += assert_longest_first(g.order[:n], g.seq_lens[:n])
        self.logits.copy_(g.body(n, meta))
        self.replays += 1


def cpu_decode_graphs(runner, max_batch: int) -> tuple[DecodeGraphs, dict[int, CpuReplay]]:
    """Decode graphs for `runner` up to `max_batch` rows whose replays run on the CPU; not yet installed."""
    graphs = DecodeGraphs(
        runner._forward_sample, runner.device, max_batch, runner.max_blocks_per_seq, runner.block_size
    )
    replays = {size: CpuReplay(graphs, runner, size) for size in graphs.sizes}
    graphs.graphs = {size: (r, r.logits) for size, r in replays.items()}
    return graphs, replays


class CpuMixedReplay:
    """A mixed-step graph's stand-in: its replay runs the graphs' body on their buffers with the torch
    backend, which reads host copies of the sequence rows (a real graph's kernels read the tile map)."""

    def __init__(self, graphs: MixedGraphs, size: int, hidden_size: int) -> None:
        self.graphs, self.size = graphs, size
        self.hidden = torch.zeros(size, hidden_size)
        self.replays = 0
        self.reordered = 0

    def replay(self) -> None:
        g, n = self.graphs, self.size
        s = g._seqs(n)
        meta = g._meta(n)
        meta.query_start_loc_cpu = g.query_start_loc[: s + 1].tolist()
        meta.seq_lens_cpu = g.seq_lens[:s].tolist()
        self.reordered += assert_longest_first(g.decode_order[:s], g.decode_seq_lens[:s])
        self.hidden.copy_(g.body(n, meta))
        self.replays += 1


def cpu_mixed_graphs(runner, max_tokens: int, **kwargs) -> tuple[MixedGraphs, dict[int, CpuMixedReplay]]:
    """Mixed-step graphs for `runner` up to `max_tokens` whose replays run on the CPU; not yet installed."""
    graphs = runner.build_mixed_graphs(max_tokens, **kwargs)
    replays = {size: CpuMixedReplay(graphs, size, runner.cfg.hidden_size) for size in graphs.sizes}
    graphs.graphs = {size: (r, r.hidden) for size, r in replays.items()}
    return graphs, replays
