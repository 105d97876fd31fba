"""Presence, frequency and repetition penalties, as vLLM v1's sampler applies them (`apply_penalties`).

Each request with a penalty owns a row of a device table while it lives: the count of every token id in its
output so far and a mask of the ids in its prompt. A row is filled once from the host when the request first
samples (its prompt, the output the host knows, and a token still in flight read from the previous step's
sampled tokens on the device), and from then on each step adds the token it sampled for the request on the
device (`StepPenalties.fold`), so the counts include the token the host does not know yet under async
scheduling, with no host work a step. Every token sampled for a request that has not finished is appended to its
output in the update (after a preemption too); tokens dropped past a stop string belong to a finished request,
whose row is released. A preempted request gives its row back too (`SamplingState.preempted`): it samples
again only once the host knows all its tokens, and its row is rebuilt then. So the rows in use never exceed the
running requests, at most `max_num_seqs`, which caps the table (`max_rows`): start-up sizing counts a full
table (`sampler_profile.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from roseinfer.request import Request
from roseinfer.runner.host_copy import to_device


def apply_penalties(
    logits: torch.Tensor,
    counts: torch.Tensor,
    in_prompt: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """Penalized float32 logits [P, V] from logits [P, V], each row's output token counts [P, V] (int), prompt
    mask [P, V] (bool) and penalties [P] (float32): repetition on ids seen in the prompt or output (a positive
    logit divided by it, another multiplied), then frequency times the count and presence where it is > 0."""
    x = logits.float()
    seen = counts > 0
    rep = torch.where(seen | in_prompt, repetition.unsqueeze(1), 1.0)
    x = torch.where(x > 0, x / rep, x * rep)
    x = x - frequency.unsqueeze(1) * counts
    return x - presence.unsqueeze(1) * seen


@dataclass
class StepPenalties:
    """The penalty rows of a batch of sampled rows, kept while the batch keeps its rows."""

    table: PenaltyTable
    rows: torch.Tensor  # [P] int64: the sampled rows with a penalty
    slots: torch.Tensor  # [P] int64: their requests' rows in the table
    presence: torch.Tensor  # [P] float32
    frequency: torch.Tensor  # [P] float32
    repetition: torch.Tensor  # [P] float32
    # Each request's first sampled row (an n > 1 prompt samples n rows; the forks take over rows 1..n-1) and
    # its table row: where the step's tokens are counted.
    fold_rows: torch.Tensor  # [F] int64
    fold_slots: torch.Tensor  # [F] int64

    def __post_init__(self) -> None:
        self._ones = torch.ones(len(self.fold_rows), dtype=torch.int32, device=self.fold_rows.device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [R, V] with the penalty rows penalized; float32 (the penalties are applied in float32, as
        vLLM's sampler does), in place where `logits` is float32 already."""
        logits = logits.float()
        t = self.table
        logits[self.rows] = apply_penalties(
            logits[self.rows],
            t.counts[self.slots],
            t.in_prompt[self.slots],
            self.presence,
            self.frequency,
            self.repetition,
        )
        return logits

    def fold(self, tokens: torch.Tensor) -> None:
        """Counts the step's sampled tokens [R] in their requests' rows, on the device."""
        index = (self.fold_slots, tokens[self.fold_rows].long())
        self.table.counts.index_put_(index, self._ones, accumulate=True)


class PenaltyTable:
    """Device rows of output token counts and prompt masks, one per running request with a penalty; grown as
    requests with a penalty arrive (a batch without any pays nothing), never past `max_rows`."""

    def __init__(self, vocab_size: int, device: torch.device, max_rows: int) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.vocab = vocab_size
        self.device = device
        self.max_rows = max_rows
        self.slot_of: dict[int, int] = {}  # request uid -> its row
        self.free: list[int] = []
        self.counts = torch.zeros((0, vocab_size), dtype=torch.int32, device=device)
        self.in_prompt = torch.zeros((0, vocab_size), dtype=torch.bool, device=device)

    def release(self, uid: int) -> None:
        slot = self.slot_of.pop(uid, None)
        if slot is not None:
            self.free.append(slot)

    def step(self, reqs: Sequence[Request], last_sampled: torch.Tensor | None) -> StepPenalties | None:
        """The penalty rows of a launched step whose sampled rows belong to `reqs` (a request once per row it
        samples, its rows together), filling the rows of requests new to the table. Call before the step
        records its own rows as the requests' `pending_row`; None where no row has a penalty."""
        rows = [k for k, r in enumerate(reqs) if r.params.has_penalties]
        if not rows:
            return None
        fresh = [r for r in dict.fromkeys(reqs[k] for k in rows) if r.uid not in self.slot_of]
        if fresh:
            self._fill(fresh, last_sampled)
        first = [k for k in rows if k == 0 or reqs[k - 1] is not reqs[k]]
        params = [reqs[k].params for k in rows]
        names = ("presence_penalty", "frequency_penalty", "repetition_penalty")
        values = np.array([[getattr(p, name) for p in params] for name in names], np.float32)
        index = np.array(
            rows
            + [self.slot_of[reqs[k].uid] for k in rows]
            + first
            + [self.slot_of[reqs[k].uid] for k in first],
            np.int64,
        )
        v, i = to_device(values, self.device), to_device(index, self.device)
        p, f = len(rows), len(first)
        return StepPenalties(
            self, i[:p], i[p : 2 * p], v[0], v[1], v[2], i[2 * p : 2 * p + f], i[2 * p + f :]
        )

    def _fill(self, fresh: list[Request], last_sampled: torch.Tensor | None) -> None:
        """Rows for `fresh` requests from what the host knows: prompt ids, output ids, and the output token
        still in flight (async scheduling), which is row `pending_row` of the previous step's sampled tokens."""
        need = len(fresh) - len(self.free)
        if need > 0:
            self._grow(len(self.slot_of) + len(self.free) + need)
        slots = [self.free.pop() for _ in fresh]
        for r, s in zip(fresh, slots):
            self.slot_of[r.uid] = s
        prompt_lens = [len(r.prompt_token_ids) for r in fresh]
        output_lens = [len(r.output_token_ids) for r in fresh]
        index = np.concatenate(
            [
                np.asarray(slots, np.int64),
                np.repeat(np.asarray(slots, np.int64), prompt_lens),
                np.fromiter((t for r in fresh for t in r.prompt_token_ids), np.int64, sum(prompt_lens)),
                np.repeat(np.asarray(slots, np.int64), output_lens),
                np.fromiter((t for r in fresh for t in r.output_token_ids), np.int64, sum(output_lens)),
            ]
        )
        i = to_device(index, self.device)
        n, p, o = len(fresh), sum(prompt_lens), sum(output_lens)
        slot_rows, i = i[:n], i[n:]
        self.counts[slot_rows] = 0
        self.in_prompt[slot_rows] = False
        self.in_prompt[i[:p], i[p : 2 * p]] = True
        i = i[2 * p :]
        self.counts.index_put_((i[:o], i[o:]), torch.ones(o, dtype=torch.int32, device=self.device), True)
        # The sampled row of this step counts as pending already (`Scheduler._commit`): more is in flight.
        in_flight = [(s, r.pending_row) for r, s in zip(fresh, slots) if r.num_pending > 1]
        if in_flight:
            if any(r.num_pending > 2 for r in fresh):
                raise RuntimeError("a request has more than one earlier token in flight")
            if last_sampled is None:
                raise RuntimeError("a request has a token in flight, but no earlier step sampled any")
            pairs = to_device(np.asarray(in_flight, np.int64).T.copy(), self.device)
            tokens = last_sampled[pairs[1]].long()
            ones = torch.ones(len(in_flight), dtype=torch.int32, device=self.device)
            self.counts.index_put_((pairs[0], tokens), ones, accumulate=True)

    def _grow(self, capacity: int) -> None:
        """At least `capacity` rows; the old table and the new one both live while the rows are copied."""
        if capacity > self.max_rows:
            raise RuntimeError(
                f"{capacity} requests with penalties hold rows; the table has at most {self.max_rows} "
                "(max_num_seqs)"
            )
        capacity = min(max(capacity, 2 * len(self.counts), 8), self.max_rows)
        old = len(self.counts)
        counts = torch.zeros((capacity, self.vocab), dtype=torch.int32, device=self.device)
        in_prompt = torch.zeros((capacity, self.vocab), dtype=torch.bool, device=self.device)
        counts[:old] = self.counts
        in_prompt[:old] = self.in_prompt
        self.counts, self.in_prompt = counts, in_prompt
        self.free.extend(range(capacity - 1, old - 1, -1))
