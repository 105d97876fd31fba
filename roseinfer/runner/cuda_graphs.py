"""CUDA graphs for decode steps, captured at start-up for padded batch sizes.

A replay reads one device buffer of per-row inputs, which the host writes with one copy per step: input
ids, positions, slots, lengths, the rows whose input id is the previous step's pending token, the logits
rows, and each row's temperature and seed. The graph fills the pending ids from the previous step's tokens,
runs the forward and samples every row (greedy, or temperature with Gumbel noise, in one pass over the
logits; on a model's PDL decode chain, in the lm_head's epilogue: `kernels/logits_sample.py`). So a graphed
step costs the host one copy in, one block-table copy, the replay and the copy out; the pieces it replaces (a
copy and an index op per input, two sampler launches) cost ~4x that on an H200's host
(`scripts/probe_host_launch.py`).

A step whose batch or block-table width exceeds what was captured runs eagerly instead: a graph never
reads past its buffers.
"""

from __future__ import annotations

import bisect
import types
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.runner.inputs import ALIGN, HostStep, fill_pending

# The per-row int32 inputs, in buffer order; the seeds (int64) take the two rows after them.
ROWS = (
    "ids",
    "positions",
    "slots",
    "seq_lens",
    "fill_index",
    "fill_row",
    "logits_index",
    "decode_order",
    "temperature",
)
SEEDS_ROW = len(ROWS)
NUM_ROWS = len(ROWS) + 2

# (ids, positions, meta, temperature, seeds, tokens) -> every row's logits [G, V], each row's token drawn into
# `tokens` (greedy where its temperature is 0, else a Gumbel-max draw keyed by its seed)
ForwardSample = Callable[
    [torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """Padded batch sizes to capture: every batch of 1..max_num_seqs rows pads by less than itself and 32 rows."""
    sizes = [1, 2, 4, 8] + list(range(16, 257, 16)) + list(range(288, max_num_seqs, 32))
    return [s for s in sizes if s < max_num_seqs] + [max_num_seqs]


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """Each row's token: the argmax where its temperature is 0, else a Gumbel-max draw. One Triton pass on
    CUDA; on the CPU (the tests' stand-in replays) torch, with noise from the global generator."""
    if logits.is_cuda:
        from roseinfer.kernels.sampling import sample_tokens

        return sample_tokens(logits, temperature, seeds)
    scores = logits.float()
    t = temperature.unsqueeze(1)
    gumbel = -torch.log(-torch.log(torch.rand_like(scores).clamp_(min=1e-20)))
    noisy = (scores / t.clamp(min=1e-20) + gumbel).argmax(dim=-1)
    return torch.where(temperature > 0, noisy, scores.argmax(dim=-1))


def held_weakly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, holding a bound method's object weakly. The graphs live inside the runner whose forward they
    call: a strong bound method would tie them in a cycle, and a dropped engine would keep its cache on
    the GPU until Python's cyclic collector happened to run."""
    if not isinstance(fn, types.MethodType):
        return fn
    method = weakref.WeakMethod(fn)

    def call(*args: Any) -> Any:
        bound = method()
        if bound is None:
            raise RuntimeError("the runner these graphs belong to is gone")
        return bound(*args)

    return call


@torch.inference_mode()
def capture_graphs(
    sizes: list[int],
    meta: Callable[[int], AttentionMetadata],
    body: Callable[[int, AttentionMetadata], torch.Tensor],
    device: torch.device,
    desc: str = "CUDA graphs",
    pool: tuple[int, int] | None = None,
) -> dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]]:
    """One graph of `body(size, meta(size))` per size, each after an eager warm-up (Triton compiles, cuBLAS
    picks its kernels); largest first, so that the smaller ones reuse its memory pool (`pool`: start in
    another set's). Maps each size to its graph and the output tensor its replays write. A progress bar named
    `desc` shows on a terminal (on an empty Triton cache the compiles make this most of start-up: 25 s of
    llama-3.1-8b's 35)."""
    graphs = {}
    for size in tqdm(sorted(sizes, reverse=True), desc=desc, unit="graph", disable=None, leave=False):
        m = meta(size)
        body(size, m)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = body(size, m)
        pool = graph.pool()
        graphs[size] = (graph, out)
    torch.cuda.synchronize(device)
    return graphs


class HostInputs:
    """A pinned host mirror of the graphs' input buffer; rewritten only once its last copy has run."""

    def __init__(self, numel: int, pin: bool) -> None:
        self.tensor = torch.zeros(numel, dtype=torch.int32, pin_memory=pin)
        self.array = self.tensor.numpy()
        self.copied = torch.cuda.Event() if pin else None

    def claim(self) -> np.ndarray:
        if self.copied is not None:
            self.copied.synchronize()
        return self.array

    def send(
        self, inputs: torch.Tensor, tables_at: int, tables: np.ndarray, block_tables: torch.Tensor
    ) -> None:
        """Packs the step's block table [b, w] after the rows at `tables_at`, copies both to the device buffer
        `inputs` in one copy, and unpacks the table into the graphs' `block_tables` [B, W]."""
        b, w = tables.shape
        end = tables_at + b * w
        self.array[tables_at:end] = tables.ravel()
        inputs[:end].copy_(self.tensor[:end], non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        block_tables[:b, :w].copy_(inputs[tables_at:end].view(b, w))


class DecodeGraphs:
    def __init__(
        self,
        forward_sample: ForwardSample,
        device: torch.device,
        max_batch: int,
        max_blocks_per_seq: int,
        block_size: int,
    ) -> None:
        self.forward_sample = held_weakly(forward_sample)
        self.device = device
        self.sizes = graph_batch_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        self.width = max_blocks_per_seq
        self.block_size = block_size
        g, w = self.max_batch, self.width
        # Each row array holds g rows plus a scratch row: padded pending-fill entries write there.
        self.stride = -(-(g + 1) // ALIGN) * ALIGN
        self.tables_at = NUM_ROWS * self.stride  # the step's block table, packed [b, w], follows the rows
        numel = self.tables_at + g * w
        i32 = dict(dtype=torch.int32, device=device)
        self.inputs = torch.zeros(numel, **i32)
        rows = self.inputs[: self.tables_at].view(NUM_ROWS, self.stride)
        self.ids, self.positions, self.slots, self.seq_lens = rows[0], rows[1], rows[2], rows[3]
        self.fill_index, self.fill_row, self.logits_index, self.order = rows[4], rows[5], rows[6], rows[7]
        self.slots.fill_(-1)  # the warm-up and capture forwards write no KV
        self.order.copy_(torch.arange(self.stride, **i32))
        self.temperature = rows[8].view(torch.float32)
        self.seeds = rows[SEEDS_ROW : SEEDS_ROW + 2].reshape(-1).view(torch.int64)
        self.query_start_loc = torch.arange(g + 1, **i32)
        self.block_tables = torch.zeros(g, w, **i32)
        self.tokens = torch.zeros(g, **i32)  # each replay's sampled tokens; the next replay's pending ids
        pin = device.type == "cuda"
        self._hosts = (HostInputs(numel, pin), HostInputs(numel, pin))
        self._num_runs = 0
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
            decode_order=self.order[:size],
        )

    def body(self, size: int, meta: AttentionMetadata) -> torch.Tensor:
        """What a graph of `size` rows runs: fill the pending ids, forward, sample; returns the logits."""
        fill_pending(self.ids, self.fill_index[:size], self.fill_row[:size], self.tokens)
        return self.forward_sample(
            self.ids[:size],
            self.positions[:size],
            meta,
            self.temperature[:size],
            self.seeds[:size],
            self.tokens[:size],
        )

    def capture(self) -> None:
        self.graphs = capture_graphs(self.sizes, self._meta, self.body, self.device, "decode graphs")

    def can_run(self, step: HostStep) -> bool:
        return (
            bool(self.graphs)
            and step.max_query_len == 1
            and step.num_seqs <= self.max_batch
            and step.block_tables.shape[1] <= self.width
            and len(step.logits_index) <= self.max_batch
            and (len(step.fill_row) == 0 or int(step.fill_row.max()) < self.max_batch)
        )

    def run(
        self,
        step: HostStep,
        prev_sampled: torch.Tensor | None,
        temperature: np.ndarray | None = None,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Replays the smallest graph that fits. Returns the logits of the sampled rows [R, V] (may be a view
        of the graph's output: read it before the next replay) and, when every row samples once, the rows'
        tokens [B] (a view of `tokens`), drawn with `temperature` (float32 [B]; None: all greedy) and seeds
        `seed + row`."""
        b, f, r = step.num_seqs, len(step.fill_index), len(step.logits_index)
        if temperature is not None and len(temperature) != b:
            raise ValueError(f"{len(temperature)} temperatures for {b} rows: the graph samples one per row")
        size = self.sizes[bisect.bisect_left(self.sizes, b)]
        host = self._hosts[self._num_runs % 2]  # the other one may still feed a queued step
        self._num_runs += 1
        buf = host.claim()
        rows = buf[: self.tables_at].reshape(NUM_ROWS, self.stride)
        # Padding rows write no KV (slot -1), attend to nothing (length 0) and sample greedily.
        for i, values, pad in (
            (0, step.input_ids, 0),
            (1, step.positions, 0),
            (2, step.slot_mapping, -1),
            (3, step.seq_lens, 0),
        ):
            rows[i, :b] = values
            rows[i, b:size] = pad
        rows[4, :f], rows[4, f:size] = step.fill_index, self.max_batch  # the scratch row
        rows[5, :f], rows[5, f:size] = step.fill_row, 0
        rows[6, :r] = step.logits_index
        rows[7, :b] = step.decode_order if len(step.decode_order) == b else np.arange(b)
        rows[7, b:size] = np.arange(b, size)  # padding rows last
        if temperature is None:
            rows[8, :size] = 0  # the bits of 0.0
        else:
            rows[8, :b] = temperature.view(np.int32)
            rows[8, b:size] = 0
            seeds = rows[SEEDS_ROW : SEEDS_ROW + 2].reshape(-1).view(np.int64)
            seeds[:b] = np.arange(seed, seed + b, dtype=np.int64)
        host.send(self.inputs, self.tables_at, step.block_tables, self.block_tables)
        if f:
            if prev_sampled is None:
                raise RuntimeError("a step feeds pending tokens, but no earlier step sampled any")
            if prev_sampled.data_ptr() != self.tokens.data_ptr():  # sampled outside the graphs
                n = min(len(prev_sampled), self.max_batch)  # can_run: no fill reads a row past these
                self.tokens[:n].copy_(prev_sampled[:n])
        graph, logits = self.graphs[size]
        graph.replay()
        if r == b and (step.logits_index == np.arange(b)).all():
            return logits[:b], self.tokens[:b]  # every row samples once: no gather
        return logits[self.logits_index[:r].long()], None
