"""allowed_token_ids, logit_bias and bad_words (`SamplingParams`) on a step's logits, as vLLM v1's sampler.

`sample` applies them in vLLM v1's order: allowed_token_ids' mask (every other id -inf), bad words' bans (-inf),
min_tokens' banned ids (-inf), logit_bias (added), then the penalties. The mask and the bias depend on the rows
alone and are kept with the cached `SamplingBatch` (`RowControls`); bad words depend on the output so far and
are asked each step (`Request.bad_word_bans`). A bad word whose prefix ends with a token still in flight (async
scheduling) is decided on the device, from the previous launch's sampled tokens, so the host never waits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from roseinfer.request import Request
from roseinfer.runner.host_copy import to_device
from roseinfer.sampling_params import SamplingParams


@dataclass
class RowControls:
    """The allowed-ids mask and the biases of a batch's sampled rows."""

    allowed_rows: torch.Tensor | None  # [A] int64: rows with allowed_token_ids
    allowed: torch.Tensor | None  # [A, V] bool: the ids each of them may draw
    bias_index: tuple[torch.Tensor, torch.Tensor] | None  # (rows, ids) int64 [B] each
    bias_values: torch.Tensor | None  # [B] float32

    @staticmethod
    def build(params: list[SamplingParams], vocab: int, device: torch.device) -> RowControls | None:
        allowed_rows = [k for k, p in enumerate(params) if p.allowed_token_ids]
        bias = [(k, t, b) for k, p in enumerate(params) if p.logit_bias for t, b in p.logit_bias.items()]
        if not allowed_rows and not bias:
            return None
        rows_t = mask = index = values = None
        if allowed_rows:
            pairs = [(a, t) for a, k in enumerate(allowed_rows) for t in params[k].allowed_token_ids or ()]
            pairs_t = to_device(np.asarray(pairs, np.int64).T.copy(), device)
            mask = torch.zeros((len(allowed_rows), vocab), dtype=torch.bool, device=device)
            mask[pairs_t[0], pairs_t[1]] = True
            rows_t = to_device(np.asarray(allowed_rows, np.int64), device)
        if bias:
            idx = to_device(np.asarray([(k, t) for k, t, _ in bias], np.int64).T.copy(), device)
            index = (idx[0], idx[1])
            values = to_device(np.asarray([b for _, _, b in bias], np.float32), device)
        return RowControls(rows_t, mask, index, values)


@dataclass
class StepControls:
    """A step's controls: its rows' mask and biases, and bad-word bans that wait on a token in flight."""

    rows: RowControls | None
    # (rows, ids, previous launch's rows, tokens) int64 [C] each: ids[i] is banned in rows[i] where the previous
    # launch sampled tokens[i] in its row previous[i].
    conditional: torch.Tensor | None
    last_sampled: torch.Tensor | None

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` in float32 (in place where they are already), with the allowed-ids mask and the bans that
        wait on a token in flight applied."""
        logits = logits.float()
        r = self.rows
        if r is not None and r.allowed is not None:
            assert r.allowed_rows is not None
            logits[r.allowed_rows] = logits[r.allowed_rows].masked_fill(~r.allowed, float("-inf"))
        if self.conditional is not None:
            assert self.last_sampled is not None
            rows, ids, previous, tokens = self.conditional
            hit = self.last_sampled[previous].long() == tokens
            add = torch.where(hit, float("-inf"), 0.0)
            logits.index_put_((rows, ids), add, accumulate=True)  # one id may wait on several tokens
        return logits

    def bias(self, logits: torch.Tensor) -> None:
        """Adds the rows' biases to float32 `logits`, in place."""
        r = self.rows
        if r is not None and r.bias_index is not None:
            assert r.bias_values is not None
            logits.index_put_(r.bias_index, r.bias_values, accumulate=True)


def bad_word_step(
    reqs: list[Request], last_sampled: torch.Tensor | None, device: torch.device
) -> tuple[list[list[int]], torch.Tensor | None]:
    """Each sampled row's bad-word ids banned outright, and the bans that wait on a token in flight (see
    `StepControls.conditional`). Call before the step records its rows as the requests' `pending_row`."""
    banned: list[list[int]] = []
    waiting: list[tuple[int, int, int, int]] = []
    for k, r in enumerate(reqs):
        now, later = r.bad_word_bans()
        banned.append(now)
        waiting.extend((k, t, r.pending_row, token) for t, token in later)
    if not waiting:
        return banned, None
    if last_sampled is None:
        raise RuntimeError("a request has a token in flight, but no earlier step sampled any")
    return banned, to_device(np.asarray(waiting, np.int64).T.copy(), device)
