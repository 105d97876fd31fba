"""CUDA graphs for steps with prefill work (prompt chunks, alone or beside decodes), captured at start-up
for a few padded token counts.

Eager, such a step launches every kernel from Python: ~15 ms of host a step for llama-3.1-8b, ~6 ms for
qwen2.5-0.5b on the H100's host, more than the GPU needs for a step of a few hundred tokens (twelfth
session). A replay issues the same launches for the price of one call. Every launch shape is fixed by the
graph's token count T:
- the step's tokens are padded to T (slot -1: no KV written, a zero attention output);
- its sequences to S = min(T, max_num_seqs) (no new tokens, length 0);
- the decode kernel takes the first S rows, with a zero output past the step's leading decodes, and cuts
  those decodes into splits on the GPU (a lone long decode beside a chunk would otherwise run unsplit: 290 us
  a layer for 10k keys of llama-3.1-8b on an H200);
- the prefill kernel runs a tile map of fixed length, whose spare programs return at once; the map may cut
  long tiles' keys across programs (kernels/prefill_plan.py). On Hopper, each graph of GRAPH_LONG_MIN_TOKENS or
  more has a twin captured at LONG_TILE's 128-row tile, whose map cuts no key (the warp-specialised kernel), for
  chunks over long cached prefixes.

The sampled rows' logits and the sampling run eagerly after the replay. A step with more tokens,
sequences, pending ids or q tiles than a graph holds, or with wider block tables, runs eagerly; so does a step
LONG_TILE's own rule takes where there is no twin for it.

How many tokens the graphs hold is chosen from the model's size unless set: a graph pays while the step's
GEMMs take the GPU less time than its eager launch takes the host. Past that the step is GPU-bound either
way, and a graph only adds its padding.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.config import ModelConfig
from roseinfer.kernels.prefill_plan import (
    GRAPH_LONG_MIN_TOKENS,
    LONG_TILE,
    SPLIT_PARTIAL_ROWS,
    TILE_ROWS,
    TilePlanner,
    cuts_keys,
    leading_decodes,
    prefill_block_m,
    prefill_tile_map,
    q_tile_count,
)
from roseinfer.runner.cuda_graphs import HostInputs, capture_graphs, held_weakly
from roseinfer.runner.inputs import ALIGN, HostStep, fill_pending

# A graph's tile map holds every tile of T tokens plus one more per prompt chunk, for this many chunks.
MAX_CHUNKS = 64

# The int32 rows of the input buffer: per token (T_max + 1: a scratch entry), then per sequence (S_max + 1).
TOKEN_ROWS = ("ids", "positions", "slots")
SEQ_ROWS = (
    "query_start_loc",
    "seq_lens",
    "decode_seq_lens",
    "decode_order",
    "fill_index",
    "fill_row",
    "logits_index",
    "decode_count",  # entry 0 only
)


# An eager step's host launch, per layer, and the rate of prefill GEMMs, as measured on the lent H100s:
# 6-21 ms of host for qwen2.5-0.5b's 24 layers and 15-21 ms for llama-3.1-8b's 32, depending on the
# host; cuBLAS at 650-765 TFLOP/s on prefill shapes. The low end is taken: a dearer host would raise
# llama's cap, but graphs past 512 tokens gained its offline throughput only 1-2% (docs/PERFORMANCE.md,
# fourteenth session).
EAGER_HOST_S_PER_LAYER = 250e-6
PREFILL_GEMM_FLOPS_PER_S = 700e12
# The automatic cap's bounds. Below 1024 even an 8B model's step is host-bound: served at 4-16 req/s,
# llama-3.1-8b's 512-token prompts beside a few decodes ran eager under a 512 cap, and graphed (cap 1024)
# its ITL p99 fell from 20-36 ms to 14-16 ms (forty-fourth session). Above 4096 the graphs' capture time
# and memory grow for steps of milliseconds of GPU on any model this engine serves.
AUTO_MAX_TOKENS = (1024, 4096)


def auto_mixed_graph_max_tokens(cfg: ModelConfig) -> int:
    """The token count at which a step's GEMMs (2 x layer params x tokens) take as long on the GPU as its
    eager launch on the host, within AUTO_MAX_TOKENS: 4096 for qwen2.5-0.5b, 1024 for llama-3.1-8b."""
    tokens = EAGER_HOST_S_PER_LAYER * PREFILL_GEMM_FLOPS_PER_S / (2 * cfg.layer_params())
    low, high = AUTO_MAX_TOKENS
    return int(min(max(tokens, low), high))


def mixed_graph_sizes(max_tokens: int) -> list[int]:
    """Padded token counts up to `max_tokens` (0: none); the gaps widen with the step's GPU time."""
    if max_tokens <= 0:
        return []
    sizes = [16, 32, 48, 64, 96, 128, 160, 192, 224, 256]
    sizes += list(range(320, 1025, 64)) + list(range(1152, 2049, 128)) + list(range(2304, 8193, 256))
    return [s for s in sizes if s < max_tokens] + [max_tokens]


class MixedPlan(NamedTuple):
    size: int  # the graph's token count
    decodes: int  # the step's leading decodes
    tiles: np.ndarray  # the prefill kernel's tile map [TILE_ROWS, N]
    long: bool = False  # the twin graph at LONG_TILE's tile


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class MixedGraphs:
    def __init__(
        self,
        forward: Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor],
        device: torch.device,
        max_tokens: int,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        max_chunks: int = MAX_CHUNKS,
        key_splits: bool = True,
        cache_dtype: torch.dtype | None = None,
    ) -> None:
        self.forward = held_weakly(forward)  # (ids, positions, meta) -> hidden [T, H]
        self.device = device
        self.sizes = mixed_graph_sizes(max_tokens)
        self.max_tokens = self.sizes[-1] if self.sizes else 0
        self.max_num_seqs = max_num_seqs
        self.width = max_blocks_per_seq
        self.block_size = block_size
        self.planner = TilePlanner(num_heads, head_dim, dtype, device, key_splits, cache_dtype, block_size)
        self.block_m = {t: prefill_block_m(head_dim, dtype, t) for t in self.sizes}
        # Every q tile of t tokens, one more per prompt chunk, and room for key splits.
        self.q_tiles = {t: -(-t // self.block_m[t]) + min(self._seqs(t), max_chunks) for t in self.sizes}
        self.num_tiles = {t: self.planner.capacity(n) for t, n in self.q_tiles.items()}
        self.long_sizes = (
            [t for t in self.sizes if t >= GRAPH_LONG_MIN_TOKENS] if self.planner.ws_long else []
        )
        # Every 128-row q tile of t tokens and one more per prompt chunk; no key splits.
        self.long_tiles = {t: -(-t // LONG_TILE[0]) + min(self._seqs(t), max_chunks) for t in self.long_sizes}
        t_max, s_max = self.max_tokens, self._seqs(self.max_tokens)
        self.token_stride, self.seq_stride = _aligned(t_max + 1), _aligned(s_max + 1)
        self.tiles_at = len(TOKEN_ROWS) * self.token_stride + len(SEQ_ROWS) * self.seq_stride
        tiles_stride = _aligned(max([*self.num_tiles.values(), *self.long_tiles.values()], default=0))
        self.tables_at = self.tiles_at + TILE_ROWS * tiles_stride
        numel = self.tables_at + s_max * self.width
        self.inputs = torch.zeros(numel, dtype=torch.int32, device=device)
        tokens = self.inputs[: len(TOKEN_ROWS) * self.token_stride].view(len(TOKEN_ROWS), -1)
        self.ids, self.positions, self.slots = tokens
        seqs = self.inputs[tokens.numel() : self.tiles_at].view(len(SEQ_ROWS), -1)
        self.query_start_loc, self.seq_lens, self.decode_seq_lens, self.decode_order = seqs[:4]
        self.fill_index, self.fill_row, self.logits_index = seqs[4], seqs[5], seqs[6]
        self.decode_count = seqs[7, :1]
        self.decode_order.copy_(torch.arange(self.seq_stride, dtype=torch.int32, device=device))
        self.tiles = self.inputs[self.tiles_at : self.tables_at].view(TILE_ROWS, tiles_stride)
        self.tiles.fill_(-1)
        self.slots.fill_(-1)  # the warm-up and capture forwards write no KV
        self.block_tables = torch.zeros(s_max, self.width, dtype=torch.int32, device=device)
        self.prev = torch.zeros(s_max, dtype=torch.int32, device=device)  # the previous step's tokens
        pin = device.type == "cuda"
        self._hosts = (HostInputs(numel, pin), HostInputs(numel, pin))
        self._num_runs = 0
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.long_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def _seqs(self, tokens: int) -> int:
        return min(tokens, self.max_num_seqs)

    def _meta(self, size: int, long: bool = False) -> AttentionMetadata:
        s = self._seqs(size)
        num_tiles = self.long_tiles[size] if long else self.num_tiles[size]
        return AttentionMetadata(
            slot_mapping=self.slots[:size],
            query_start_loc=self.query_start_loc[: s + 1],
            seq_lens=self.seq_lens[:s],
            block_tables=self.block_tables[:s],
            max_query_len=size,
            max_seq_len=self.width * self.block_size,  # launch shapes for the longest context
            query_start_loc_cpu=[],  # no host copies: nothing in a graph may read them
            seq_lens_cpu=[],
            prefill_tiles=self.tiles[:, :num_tiles],
            tile_block_m=LONG_TILE[0] if long else self.block_m[size],
            split_rows=SPLIT_PARTIAL_ROWS if self.planner.split is not None and not long else 0,
            decode_seq_lens=self.decode_seq_lens[:s],
            decode_count=self.decode_count,
            decode_order=self.decode_order[:s],
        )

    def body(self, size: int, meta: AttentionMetadata) -> torch.Tensor:
        """What a graph of `size` tokens runs: fill the pending ids, forward; returns the hidden states."""
        s = self._seqs(size)
        fill_pending(self.ids, self.fill_index[:s], self.fill_row[:s], self.prev)
        return self.forward(self.ids[:size], self.positions[:size], meta)

    def capture(self) -> None:
        self.graphs = capture_graphs(self.sizes, self._meta, self.body, self.device, "mixed-step graphs")
        if self.long_sizes:  # in the same memory pool: a replay of one leaves nothing the other reads
            long_meta = functools.partial(self._meta, long=True)
            pool = self.graphs[self.max_tokens][0].pool()
            self.long_graphs = capture_graphs(
                self.long_sizes, long_meta, self.body, self.device, "mixed-step graphs, long tile", pool
            )

    def num_graphs(self) -> int:
        return len(self.graphs) + len(self.long_graphs)

    def plan(self, step: HostStep) -> MixedPlan | None:
        """The smallest captured graph that holds the step (or its LONG_TILE twin), with the step's decodes and
        tile map; None: run the step eagerly."""
        if not self.graphs or step.num_tokens > self.max_tokens or step.max_query_len <= 1:
            return None
        size = self.sizes[bisect.bisect_left(self.sizes, step.num_tokens)]
        s = self._seqs(size)
        if step.num_seqs > s or len(step.fill_index) > s or len(step.logits_index) > s:
            return None
        if step.block_tables.shape[1] > self.width:
            return None
        if len(step.fill_row) and int(step.fill_row.max()) >= len(self.prev):
            return None
        q_lens = np.diff(step.query_start_loc)
        decodes = leading_decodes(q_lens)
        chunks = q_lens[decodes:]
        prefixes = step.seq_lens[decodes : len(q_lens)] - chunks
        planner = self.planner
        if planner.long_tile_pays(chunks, prefixes) and planner.long_map_cuts_no_key(
            step.query_start_loc, step.seq_lens, decodes
        ):
            # The twin graph, or eagerly where there is none: there LONG_TILE gains more than the launches cost
            # the host (llama-3.1-8b: W7's chunks). Where its map would cut keys (models of at most 16 heads,
            # whose eager steps are host-bound), the 64-row graph below.
            return self._long_plan(step, size, decodes, chunks)
        block_m, n = self.block_m[size], self.num_tiles[size]
        if q_tile_count(chunks, block_m) > self.q_tiles[size]:
            return None
        tiles = planner.tile_map(step.query_start_loc, step.seq_lens, decodes, block_m, n)
        if not cuts_keys(tiles) and planner.graph_long_tile_pays(chunks, prefixes):
            return self._long_plan(step, size, decodes, chunks) or MixedPlan(size, decodes, tiles)
        return MixedPlan(size, decodes, tiles)

    def _long_plan(self, step: HostStep, size: int, decodes: int, chunks: np.ndarray) -> MixedPlan | None:
        """The step (its `chunks` after `decodes` decodes) in the twin graph of `size` at LONG_TILE's tile, with a
        map that cuts no key; None where there is no such twin or its map cannot hold the chunks' q tiles."""
        if size not in self.long_graphs:
            return None
        n = self.long_tiles[size]
        if q_tile_count(chunks, LONG_TILE[0]) > n:
            return None
        tiles = prefill_tile_map(step.query_start_loc, step.seq_lens, decodes, LONG_TILE[0], n)
        return MixedPlan(size, decodes, tiles, long=True)

    def run(self, step: HostStep, plan: MixedPlan, prev_sampled: torch.Tensor | None) -> torch.Tensor:
        """Replays the graph `plan` names; returns the hidden states of the sampled rows [R, H], gathered
        eagerly after the replay."""
        size, decodes = plan.size, plan.decodes
        b, t, f, r = step.num_seqs, step.num_tokens, len(step.fill_index), len(step.logits_index)
        s = self._seqs(size)
        host = self._hosts[self._num_runs % 2]  # the other one may still feed a queued step
        self._num_runs += 1
        buf = host.claim()
        tokens = buf[: len(TOKEN_ROWS) * self.token_stride].reshape(len(TOKEN_ROWS), -1)
        for i, values, pad in ((0, step.input_ids, 0), (1, step.positions, 0), (2, step.slot_mapping, -1)):
            tokens[i, :t] = values
            tokens[i, t:size] = pad
        seqs = buf[tokens.size : self.tiles_at].reshape(len(SEQ_ROWS), -1)
        seqs[0, : b + 1] = step.query_start_loc
        seqs[0, b + 1 : s + 1] = t  # padding sequences: no new tokens
        seqs[1, :b] = step.seq_lens
        seqs[1, b:s] = 0
        seqs[2, :decodes] = step.seq_lens[:decodes]
        seqs[2, decodes:s] = 0
        seqs[3, :decodes] = step.decode_order if len(step.decode_order) == decodes else np.arange(decodes)
        seqs[3, decodes:s] = np.arange(decodes, s)  # the rows of length 0 last
        seqs[4, :f], seqs[4, f:s] = step.fill_index, self.max_tokens  # the scratch entry
        seqs[5, :f], seqs[5, f:s] = step.fill_row, 0
        seqs[6, :r] = step.logits_index
        seqs[7, 0] = decodes
        tiles = buf[self.tiles_at : self.tables_at].reshape(TILE_ROWS, -1)
        tiles[:, : plan.tiles.shape[1]] = plan.tiles
        host.send(self.inputs, self.tables_at, step.block_tables, self.block_tables)
        if f:
            if prev_sampled is None:
                raise RuntimeError("a step feeds pending tokens, but no earlier step sampled any")
            k = min(len(prev_sampled), len(self.prev))  # plan: no fill reads a row past these
            self.prev[:k].copy_(prev_sampled[:k])
        graph, hidden = (self.long_graphs if plan.long else self.graphs)[size]
        graph.replay()
        return hidden[self.logits_index[:r].long()]
