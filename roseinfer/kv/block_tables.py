"""A host mirror of the requests' block tables as rows of one int32 array, kept by the KV cache manager
beside each request's `block_ids` list, so that a step's block table is one numpy gather.

Converting every scheduled request's block list to numpy on every step cost the host ~220 us a step at
W2's batch of ~200 sequences of ~800 tokens (10k Python ints); the gather takes a few us. A row belongs
to one request from its first blocks until it frees them; past the request's blocks a row holds zeros.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from roseinfer.request import Request


class BlockTables:
    def __init__(self, rows: int = 64, width: int = 64) -> None:
        self.array = np.zeros((rows, width), np.int32)
        self._free_rows = list(range(rows - 1, -1, -1))  # popped from the end: row 0 first

    @property
    def rows_in_use(self) -> int:
        return len(self.array) - len(self._free_rows)

    def _row(self, req: Request) -> int:
        if req.table_row < 0:
            if not self._free_rows:
                grown = len(self.array)
                self.array = np.concatenate([self.array, np.zeros_like(self.array)])
                self._free_rows = list(range(len(self.array) - 1, grown - 1, -1))
            req.table_row = self._free_rows.pop()
        return req.table_row

    def write(self, req: Request, start: int, blocks: Sequence[int]) -> None:
        """Entries start .. start + len(blocks) - 1 of `req`'s row (giving it a row if it has none)."""
        row = self._row(req)
        end = start + len(blocks)
        if end > self.array.shape[1]:
            width = max(end, 2 * self.array.shape[1])
            self.array = np.pad(self.array, ((0, 0), (0, width - self.array.shape[1])))
        self.array[row, start:end] = blocks

    def set(self, req: Request, index: int, block: int) -> None:
        self.array[self._row(req), index] = block

    def release(self, req: Request, length: int) -> None:
        """Zero the row's first `length` entries (the request's blocks) and give the row back."""
        if req.table_row >= 0:
            self.array[req.table_row, :length] = 0
            self._free_rows.append(req.table_row)
            req.table_row = -1

    def gather(self, rows: np.ndarray, width: int) -> np.ndarray:
        """[len(rows), width] int32: the given rows' first `width` entries (a copy)."""
        return self.array[rows, :width]

    def check(self, requests: Sequence[Request]) -> None:
        """Every request's row equals its block list, zeros past it; the rows in use are exactly theirs."""
        held = [r for r in requests if r.table_row >= 0]
        if len({r.table_row for r in held}) != len(held):
            raise AssertionError("two requests share a block-table row")
        if len(held) != self.rows_in_use:
            raise AssertionError(f"{self.rows_in_use} block-table rows in use, {len(held)} requests hold one")
        for r in requests:
            if r.table_row < 0:
                if r.block_ids:
                    raise AssertionError(f"{r} holds blocks but no block-table row")
                continue
            row = self.array[r.table_row]
            n = len(r.block_ids)
            if row[:n].tolist() != r.block_ids or row[n:].any():
                raise AssertionError(f"{r}: block-table row {row[: n + 1].tolist()} != {r.block_ids}")
        free = self.array[self._free_rows]
        if free.any():
            raise AssertionError("a free block-table row holds entries")
