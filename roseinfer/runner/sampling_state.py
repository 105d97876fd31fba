"""The runner's per-request sampling state: seeded generators, the sampled rows' settings (rebuilt only when
the rows change), and the penalty table's rows."""

from __future__ import annotations

from operator import attrgetter

import torch

from roseinfer.request import Request
from roseinfer.runner.logit_controls import RowControls, StepControls, bad_word_step
from roseinfer.runner.penalties import PenaltyTable, StepPenalties
from roseinfer.runner.sampler import BannedTokens, SamplingBatch, banned_pairs

_UID = attrgetter("uid")


class SamplingState:
    def __init__(self, vocab_size: int, device: torch.device, seed: int, max_rows: int) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.max_rows = max_rows  # the most rows a step samples: max_num_seqs
        self.generators: dict[tuple[int, int], torch.Generator] = {}
        self._key: tuple[int, ...] = ()
        self._cache: SamplingBatch | None = None
        # Penalty rows of the cached batch, and the table of output counts they read (made on first use).
        self.penalties: StepPenalties | None = None
        self.penalty_table: PenaltyTable | None = None
        # Allowed-ids masks and biases of the cached batch's rows.
        self.row_controls: RowControls | None = None
        # Noise of eagerly sampled rows without a seed of their own (the graphs take theirs from the runner).
        self._unseeded = torch.Generator(device=device).manual_seed(seed)

    def masks(
        self, reqs: list[Request], batch: SamplingBatch, last_sampled: torch.Tensor | None
    ) -> tuple[BannedTokens | None, StepControls | None]:
        """The step's banned tokens (its stop ids while under min_tokens, its bad words' last tokens; None where
        there are none) and its logit controls; asked only for a batch with min_tokens or controls, so that
        other steps sample as fast as any. Call before the step records its rows as the requests' `pending_row`."""
        banned: list[list[int]] | None = None
        if batch.any_min_tokens:
            banned = [list(r.banned_token_ids()) for r in reqs]
        waiting = None
        if batch.any_bad_words:
            words, waiting = bad_word_step(reqs, last_sampled, self.device)
            banned = words if banned is None else [a + b for a, b in zip(banned, words)]
        controls = None
        if batch.any_logit_controls:
            controls = StepControls(self.row_controls, waiting, last_sampled)
        # Only allowed ids or biases: no per-row ban lists to build or upload each step.
        pairs = None if banned is None else banned_pairs(banned, self.vocab_size, self.device)
        return pairs, controls

    def batch(self, rows: list[int], reqs: list[Request], last_sampled: torch.Tensor | None) -> SamplingBatch:
        """The sampled rows' settings, rebuilt only when the rows change: a decode batch keeps the same
        requests in the same order for many steps. Keyed by internal uids, which are never reused.
        `last_sampled`: the previous launch's sampled tokens, where a new penalty row finds a token in flight."""
        key = tuple(map(_UID, reqs))
        if key == self._key and self._cache is not None:
            return self._cache
        seen: dict[int, int] = {}
        gens = []
        for i, r in zip(rows, reqs):
            j = seen[i] = seen.get(i, -1) + 1  # the j-th sample of this row: child j of a fork
            gens.append(self.generator(r, j))
        batch = SamplingBatch.build(
            [r.params for r in reqs], gens, self.vocab_size, self.device, self._unseeded
        )
        self.penalties = None
        self.row_controls = None
        if batch.any_logit_controls:
            self.row_controls = RowControls.build([r.params for r in reqs], self.vocab_size, self.device)
        if batch.any_penalties:  # before `launch` makes this step's rows the requests' pending rows
            if self.penalty_table is None:
                self.penalty_table = PenaltyTable(self.vocab_size, self.device, self.max_rows)
            self.penalties = self.penalty_table.step(reqs, last_sampled)
        self._key, self._cache = key, batch
        return batch

    def generator(self, req: Request, fork_index: int = 0) -> torch.Generator | None:
        """The sample's own generator when seeded. Keyed by the engine's internal request uid (user ids
        cannot collide with it); sample i of an n > 1 request is seeded from (seed, i)."""
        seed = req.params.seed
        if seed is None or req.params.greedy:
            return None
        key = self.generator_key(req, fork_index)
        gen = self.generators.get(key)
        if gen is None:
            index = key[1]
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed if index == 0 else (seed * 1_000_003 + index) % 2**63)
            self.generators[key] = gen
        return gen

    @staticmethod
    def generator_key(req: Request, fork_index: int = 0) -> tuple[int, int]:
        root = req.parent or req
        return root.uid, req.sample_index + fork_index

    def release(self, req: Request) -> None:
        """A finished request's generator and penalty row."""
        self.generators.pop(self.generator_key(req), None)
        if self.penalty_table is not None:
            self.penalty_table.release(req.uid)

    def preempted(self, reqs: list[Request]) -> None:
        """Preempted requests' penalty rows, given back so that the table stays within the running requests;
        each is rebuilt from the host when its request samples again (it rejoins only once the host knows all
        its tokens). The cached batch is dropped: a request preempted and re-admitted in one step keeps its key
        but not its row. Its generator stays: its draws go on where they were."""
        table = self.penalty_table
        if table is None or not any(r.uid in table.slot_of for r in reqs):
            return
        for r in reqs:
            table.release(r.uid)
        self._key, self._cache = (), None
