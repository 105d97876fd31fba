"""Prompt logprobs (`SamplingParams.prompt_logprobs`) of one step: the lm_head over the prompt rows that ask.

A step's spans (`SchedulerOutput.prompt_logprobs`) name the prompt positions it computes logprobs for; the
row of position p holds the hidden state whose logits give the distribution of prompt token p + 1. The
logits of every prompt row at once could be huge (8k rows of a 150k vocabulary: 5 GB in float32), so they
are taken `SLICE_ROWS` rows at a time, each slice reduced to its rows' top-k and prompt token (logprob and
rank, `gather_logprobs`) before the next; the step's packed rows then go to the host in one copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from roseinfer.logprobs import TokenLogprobs, num_logprobs
from roseinfer.runner.host_copy import to_device
from roseinfer.runner.inputs import HostStep
from roseinfer.runner.sampler import compute_logprobs, gather_logprobs, unpack_logprobs
from roseinfer.scheduler.scheduler import SchedulerOutput

# Rows of logits alive at once: about what a decode step of max_num_seqs rows holds (the peak that sizing
# the KV cache measured).
SLICE_ROWS = 256


@dataclass
class PromptLogprobsRows:
    """One step's prompt-logprob rows: where each is in the step's hidden states, which token it scores."""

    spans: list[tuple[int, int, int]]  # (scheduled index, first position, end position)
    rows: np.ndarray  # [R] int64: rows of the step's hidden states, span after span
    targets: np.ndarray  # [R] int64: the prompt token each row scores (the one after its position)
    k: int  # the most top logprobs any span's request asks for (-1 resolved to the vocabulary)


def prompt_logprobs_rows(out: SchedulerOutput, step: HostStep, vocab_size: int) -> PromptLogprobsRows:
    """The rows of `out.prompt_logprobs` (non-empty) in the step `step` lays out."""
    rows, targets, k = [], [], 0
    qsl = step.query_start_loc
    for index, first, end in out.prompt_logprobs:
        s = out.scheduled[index]
        base = int(qsl[index]) - s.start  # the row of position 0, were it in this step
        rows.append(np.arange(base + first, base + end, dtype=np.int64))
        targets.append(np.asarray(s.request.prompt_token_ids[first + 1 : end + 1], dtype=np.int64))
        k = max(k, min(num_logprobs(s.request.params.prompt_logprobs, vocab_size), vocab_size))
    return PromptLogprobsRows(list(out.prompt_logprobs), np.concatenate(rows), np.concatenate(targets), k)


def compute_prompt_logprobs(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    job: PromptLogprobsRows,
    device: torch.device,
) -> torch.Tensor:
    """`gather_logprobs`' packed rows [R, 2k + 3] (int32, on the device) for the job's rows of `hidden`, the
    lm_head (`compute_logits`) run over `SLICE_ROWS` rows at a time."""
    index = to_device(np.stack((job.rows, job.targets)), device)
    rows, targets = index[0], index[1]
    n = rows.numel()
    packed = torch.empty((n, 2 * job.k + 3), dtype=torch.int32, device=device)
    for a in range(0, n, SLICE_ROWS):
        b = min(a + SLICE_ROWS, n)
        logprobs = compute_logprobs(compute_logits(hidden[rows[a:b]]))
        packed[a:b] = gather_logprobs(logprobs, targets[a:b], job.k)
        del logprobs
    return packed


class PromptLogprobsResult:
    """A step's packed prompt logprobs on their way to the host: from the device in one copy, queued without
    waiting (into pinned memory), valid once the step's event has passed."""

    def __init__(self, spans: list[tuple[int, int, int]], packed: torch.Tensor) -> None:
        self.spans = spans
        if packed.is_cuda:
            host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            packed = host.copy_(packed, non_blocking=True)
        self.packed = packed

    def by_span(self) -> list[tuple[int, int, list[TokenLogprobs]]]:
        """(scheduled index, first position, each position's `TokenLogprobs`), span by span."""
        entries = unpack_logprobs(self.packed.numpy())
        out, at = [], 0
        for index, first, end in self.spans:
            out.append((index, first, entries[at : at + end - first]))
            at += end - first
        return out
