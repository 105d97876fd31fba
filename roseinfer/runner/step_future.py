"""A launched step's sampled tokens on their way to the host: what the engine core waits on, a step later
with async scheduling."""

from __future__ import annotations

import torch

from roseinfer.logprobs import TokenLogprobs
from roseinfer.profiling import record
from roseinfer.runner.prompt_logprobs import PromptLogprobsResult
from roseinfer.runner.sampler import unpack_logprobs


class StepFuture:
    """A launched step's sampled tokens (and their logprobs where some row asked), on their way to the host."""

    def __init__(
        self,
        num_scheduled: int,
        rows: list[int],
        tokens: torch.Tensor | None,
        done: torch.cuda.Event | None,
        one_each: bool = False,
        logprobs: torch.Tensor | None = None,
        prompt: PromptLogprobsResult | None = None,
    ) -> None:
        self.num_scheduled = num_scheduled
        self.rows = rows  # the scheduled request of each sampled token
        self.one_each = one_each  # rows are 0 .. num_scheduled - 1: each request sampled once
        self.tokens = tokens  # host tensor, valid once `done` has passed
        self.done = done
        self.packed_logprobs = logprobs  # host tensor, `gather_logprobs`' rows, copied before `done`
        self.prompt = prompt  # the prompt logprobs some scheduled request computed, copied before `done`

    def result(self) -> list[list[int]]:
        """Waits for the step; returns the tokens of each scheduled request (empty where it did not sample)."""
        if self.tokens is None:
            return [[] for _ in range(self.num_scheduled)]
        with record("wait_device"):
            if self.done is not None:
                self.done.synchronize()
            tokens = self.tokens.tolist()
        return self._by_request(tokens)

    def logprobs(self) -> list[list[TokenLogprobs]] | None:
        """After `result`: each scheduled request's tokens' logprobs, in the same order; None where the step
        computed none (no sampled row asked)."""
        if self.packed_logprobs is None:
            return None
        if self.done is not None:
            self.done.synchronize()  # no wait: `result` waited for this event, which the copy precedes
        return self._by_request(unpack_logprobs(self.packed_logprobs.numpy()))

    def prompt_logprobs(self) -> list[tuple[int, int, list[TokenLogprobs]]]:
        """(scheduled index, first position, each position's logprobs) of the prompt positions the step
        computed logprobs for (`SchedulerOutput.prompt_logprobs`); empty where none."""
        if self.prompt is None:
            return []
        if self.done is not None:
            self.done.synchronize()
        return self.prompt.by_span()

    def _by_request(self, per_row: list) -> list[list]:
        if self.one_each:
            return [[x] for x in per_row]
        out: list[list] = [[] for _ in range(self.num_scheduled)]
        for i, x in zip(self.rows, per_row):
            out[i].append(x)
        return out
