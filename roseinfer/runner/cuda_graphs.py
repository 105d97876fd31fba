"""CUDA graphs for decode steps, captured at start-up for padded batch sizes.

Each graph reads fixed device buffers (ids, positions, slots, lengths, block tables) and writes the
logits of its padded batch. A step whose batch or block-table width exceeds what was captured runs
eagerly instead: a graph never reads past its buffers.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np
import torch

from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.runner.inputs import HostStep, Staging, fill_pending


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, 257, 16)) + list(range(288, 1025, 32))
    return [s for s in sizes if s < max_num_seqs] + [max_num_seqs]


class DecodeGraphs:
    def __init__(
        self,
        forward: Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor],
        device: torch.device,
        max_batch: int,
        max_blocks_per_seq: int,
        block_size: int,
    ) -> None:
        self.forward = forward  # (ids, positions, meta) -> logits [G, V]
        self.device = device
        self.sizes = graph_batch_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        self.width = max_blocks_per_seq
        self.block_size = block_size
        g, w = self.max_batch, self.width
        i32 = dict(dtype=torch.int32, device=device)
        self.ids = torch.zeros(g, **i32)
        self.positions = torch.zeros(g, **i32)
        self.slots = torch.full((g,), -1, **i32)
        self.seq_lens = torch.zeros(g, **i32)
        self.query_start_loc = torch.arange(g + 1, **i32)
        self.block_tables = torch.zeros(g, w, **i32)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slots[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            max_query_len=1,
            max_seq_len=self.width * self.block_size,  # launch shapes for the longest context
            query_start_loc_cpu=list(range(size + 1)),
            seq_lens_cpu=[1] * size,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for size in reversed(self.sizes):  # largest first: the smaller ones reuse its memory pool
            meta = self._meta(size)
            ids, pos = self.ids[:size], self.positions[:size]
            self.forward(ids, pos, meta)  # warm-up: Triton compiles, cuBLAS picks its kernels
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self.forward(ids, pos, meta)
            pool = graph.pool()
            self.graphs[size] = (graph, logits)
        torch.cuda.synchronize(self.device)

    def can_run(self, step: HostStep) -> bool:
        return (
            bool(self.graphs)
            and step.max_query_len == 1
            and step.num_seqs <= self.max_batch
            and step.block_tables.shape[1] <= self.width
        )

    def run(self, step: HostStep, staging: Staging, prev_sampled: torch.Tensor | None) -> torch.Tensor:
        """Replays the smallest graph that fits; returns the logits of the sampled rows [R, V] (may be a
        view of the graph's output: read it before the next replay)."""
        b = step.num_seqs
        size = self.sizes[bisect.bisect_left(self.sizes, b)]
        w = step.block_tables.shape[1]
        ids, pos, slots, seq_lens, tables, fill_index, fill_row, logits_index = staging.upload(
            [
                step.input_ids,
                step.positions,
                step.slot_mapping,
                step.seq_lens,
                step.block_tables,
                step.fill_index,
                step.fill_row,
                step.logits_index,
            ]
        )
        self.ids[:b].copy_(ids)
        fill_pending(self.ids, fill_index, fill_row, prev_sampled)
        self.positions[:b].copy_(pos)
        self.slots[:b].copy_(slots)
        self.seq_lens[:b].copy_(seq_lens)
        self.block_tables[:b, :w].copy_(tables)
        if size > b:  # padding rows: write nothing, attend to nothing
            self.slots[b:size].fill_(-1)
            self.seq_lens[b:size].zero_()
        graph, logits = self.graphs[size]
        graph.replay()
        if len(step.logits_index) == b and (step.logits_index == np.arange(b)).all():
            return logits[:b]  # every row samples once: no gather
        return logits[logits_index.long()]
