"""Step inputs built with numpy (no per-token Python loops) and moved in one host-to-device copy."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter

import numpy as np
import torch

from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.kernels.paged_decode_split import decode_order
from roseinfer.kernels.prefill_plan import leading_decodes, partial_rows
from roseinfer.scheduler.scheduler import SchedulerOutput


@dataclass
class HostStep:
    """One step's batch as host arrays (int32), before it goes to the device."""

    input_ids: np.ndarray  # [T]; 0 at pending positions (filled on the device)
    positions: np.ndarray  # [T]
    slot_mapping: np.ndarray  # [T]
    query_start_loc: np.ndarray  # [B + 1]
    seq_lens: np.ndarray  # [B]
    block_tables: np.ndarray  # [B, W]
    max_query_len: int
    # Input rows whose token is still pending, and where the previous step's sampled tokens hold it.
    fill_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [F]
    fill_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [F]
    # The row of each sampled token's logits (a sequence's last new token, once per sample).
    logits_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [R]
    # The scheduled request of each sampled token, and whether that is every request once (the usual).
    sample_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [R]
    one_sample_each: bool = False
    # The leading decodes' rows in the order the decode kernel serves them, longest first (`decode_order`).
    decode_order: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [D]

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


def one_prefill_step(num_tokens: int, block_size: int) -> HostStep:
    """A single sequence's prefill of `num_tokens` tokens (id 0) over blocks 0, 1, ...: the step start-up
    sizing measures."""
    i32 = np.int32
    num_blocks = -(-num_tokens // block_size)
    return HostStep(
        input_ids=np.zeros(num_tokens, i32),
        positions=np.arange(num_tokens, dtype=i32),
        slot_mapping=np.arange(num_tokens, dtype=i32),
        query_start_loc=np.array([0, num_tokens], i32),
        seq_lens=np.array([num_tokens], i32),
        block_tables=np.arange(num_blocks, dtype=i32)[None],
        max_query_len=num_tokens,
    )


def block_table_array(rows: list[list[int]]) -> np.ndarray:
    """[len(rows), longest] int32, each row's block ids left-aligned and zero past its end; filled with one
    boolean-mask assignment rather than a slice assignment per row."""
    counts = np.fromiter(map(len, rows), np.int64, len(rows))
    width = int(counts.max()) if len(rows) else 0
    tables = np.zeros((len(rows), width), np.int32)
    flat = np.fromiter(chain.from_iterable(rows), np.int32, int(counts.sum()))
    tables[np.arange(width) < counts[:, None]] = flat
    return tables


_REQUEST = attrgetter("request")
_START = attrgetter("start")
_NUM_NEW = attrgetter("num_new_tokens")
_NUM_SAMPLES = attrgetter("num_samples")
_TOKENS = attrgetter("all_token_ids")
_BLOCKS = attrgetter("block_ids")
_TABLE_ROW = attrgetter("table_row")
_PENDING_ROW = attrgetter("pending_row")


def build_host_step(out: SchedulerOutput, block_size: int) -> HostStep:
    """Call after `schedule()` committed `out`: each request's new tokens start at `ScheduledRequest.start`."""
    sched = out.scheduled
    n = len(sched)
    reqs = list(map(_REQUEST, sched))
    starts = np.fromiter(map(_START, sched), np.int64, n)
    lens = np.fromiter(map(_NUM_NEW, sched), np.int64, n)
    if out.tables is not None:  # the KV manager's mirror: one gather
        counts = np.fromiter(map(len, map(_BLOCKS, reqs)), np.int64, n)
        rows = np.fromiter(map(_TABLE_ROW, reqs), np.int64, n)
        if n and rows.min() < 0:
            raise RuntimeError("a scheduled request has no block-table row")
        tables = out.tables.gather(rows, int(counts.max()) if n else 0)
    else:
        tables = block_table_array(list(map(_BLOCKS, reqs)))
    token_lists = list(map(_TOKENS, reqs))
    # A pending token (async scheduling) is the last of its request's new tokens; its id is on the device.
    known = np.fromiter(map(len, token_lists), np.int64, n)
    pending = starts + lens > known
    max_query_len = int(lens.max())
    if max_query_len == 1:  # decode: one token per request, no slicing
        cu = np.arange(n + 1, dtype=np.int64)
        positions = starts
        # The token at `start`: the last one for a decode, the next one for a 1-token prompt chunk.
        ids = np.fromiter(
            (t[c] if c < k else 0 for t, c, k in zip(token_lists, starts.tolist(), known.tolist())),
            np.int64,
            n,
        )
        slots = tables[cu[:-1], positions // block_size].astype(np.int64)
    else:
        cu = np.zeros(n + 1, np.int64)
        np.cumsum(lens, out=cu[1:])
        ids = np.zeros(int(cu[-1]), np.int64)
        for i, t in enumerate(token_lists):
            seg = t[starts[i] : starts[i] + lens[i]]
            ids[cu[i] : cu[i] + len(seg)] = seg
        seq_of_token = np.repeat(np.arange(n), lens)
        positions = np.arange(int(cu[-1])) - cu[:-1][seq_of_token] + starts[seq_of_token]
        slots = tables[seq_of_token, positions // block_size].astype(np.int64)
    slots = slots * block_size + positions % block_size
    samples = np.fromiter(map(_NUM_SAMPLES, sched), np.int64, n)
    one_each = bool((samples == 1).all())
    last = cu[1:] - 1
    seq_lens = starts + lens
    i32 = np.int32
    return HostStep(
        input_ids=ids.astype(i32),
        positions=positions.astype(i32),
        slot_mapping=slots.astype(i32),
        query_start_loc=cu.astype(i32),
        seq_lens=seq_lens.astype(i32),
        block_tables=tables,
        max_query_len=max_query_len,
        fill_index=last[pending].astype(i32),
        fill_row=np.fromiter(map(_PENDING_ROW, reqs), i32, n)[pending],
        logits_index=(last if one_each else np.repeat(last, samples)).astype(i32),
        sample_rows=np.arange(n, dtype=i32) if one_each else np.repeat(np.arange(n, dtype=i32), samples),
        one_sample_each=one_each,
        decode_order=decode_order(seq_lens[: n if max_query_len == 1 else leading_decodes(lens)]),
    )


def fill_pending(
    ids: torch.Tensor, fill_index: torch.Tensor, fill_row: torch.Tensor, prev: torch.Tensor | None
) -> None:
    """Write the previous step's sampled tokens (still on the device) into the rows that feed them: one
    launch on CUDA (`kernels/pending_ids.py`)."""
    if fill_index.numel():
        if prev is None:
            raise RuntimeError("a step feeds pending tokens, but no earlier step sampled any")
        if ids.is_cuda:
            from roseinfer.kernels.pending_ids import scatter_pending

            scatter_pending(ids, fill_index, fill_row, prev)
        else:
            ids[fill_index.long()] = prev[fill_row.long()].to(ids.dtype)


ALIGN = 16  # int32 elements


class Staging:
    """A pinned host buffer and a device buffer of int32: many arrays, one copy."""

    def __init__(self, device: torch.device, capacity: int = 1 << 16) -> None:
        self.device = device
        self.pin = device.type == "cuda"
        # Marks the last host-to-device copy out of `host`: the host buffer is rewritten only after it ran.
        self.copied = torch.cuda.Event() if self.pin else None
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        self.host = torch.empty(capacity, dtype=torch.int32, pin_memory=self.pin)
        self.host_np = self.host.numpy()
        self.dev = (
            self.host
            if self.device.type == "cpu"
            else torch.empty(capacity, dtype=torch.int32, device=self.device)
        )

    def upload(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        # Every view starts 64-byte aligned: Triton specialises kernels on pointer alignment, and views at
        # step-dependent offsets would compile new variants in the middle of serving.
        starts = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum([-(-a.size // ALIGN) * ALIGN for a in arrays], out=starts[1:])
        total = int(starts[-1])
        if total > self.host.numel():
            self._alloc(max(total, 2 * self.host.numel()))
        if self.copied is not None:
            self.copied.synchronize()  # a step with no host sync may still have its copy queued
        views = []
        for a, offset in zip(arrays, starts.tolist()):
            self.host_np[offset : offset + a.size] = a.ravel()
            views.append((offset, a.shape))
        if self.dev is not self.host:
            self.dev[:total].copy_(self.host[:total], non_blocking=True)
            if self.copied is not None:
                self.copied.record()
        return [self.dev[o : o + int(np.prod(shape))].view(shape) for o, shape in views]


def upload_step(
    step: HostStep,
    staging: Staging,
    prev_sampled: torch.Tensor | None = None,
    tiles: tuple[np.ndarray, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
    """(input ids, positions, metadata, logits rows), with pending input ids filled from `prev_sampled`.
    `tiles`: the prefill kernel's tile map and its q tile height (`TilePlanner.eager_map`), sent in the
    same copy."""
    arrays = [
        step.input_ids,
        step.positions,
        step.slot_mapping,
        step.query_start_loc,
        step.seq_lens,
        step.block_tables,
        step.fill_index,
        step.fill_row,
        step.logits_index,
        step.decode_order,
    ]
    if tiles is not None:
        arrays.append(tiles[0])
    ids, pos, slots, qsl, seq_lens, tables, fill_index, fill_row, logits_index, order, *tile_map = (
        staging.upload(arrays)
    )
    fill_pending(ids, fill_index, fill_row, prev_sampled)
    meta = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=qsl,
        seq_lens=seq_lens,
        block_tables=tables,
        max_query_len=step.max_query_len,
        max_seq_len=int(step.seq_lens.max()),
        query_start_loc_cpu=step.query_start_loc.tolist(),
        seq_lens_cpu=step.seq_lens.tolist(),
        decode_order=order if len(step.decode_order) else None,
    )
    if tiles is not None:
        meta.prefill_tiles, meta.tile_block_m, meta.split_rows = tile_map[0], tiles[1], partial_rows(tiles[0])
    return ids, pos, meta, logits_index
