"""What `generate` returns, in vLLM's shape: RequestOutput holding one CompletionOutput per sample."""

from __future__ import annotations

from dataclasses import dataclass, field

from roseinfer.logprobs import PromptLogprobs, SampleLogprobs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    # The stop string or stop token id that ended it; None for eos, length, abort or still running (as vLLM).
    stop_reason: str | int | None = None
    # With SamplingParams.logprobs: one dict per token of token_ids (the sampled token, then the top-k of the
    # raw logits' log_softmax), and the sum of the sampled tokens' logprobs. None without it (as vLLM).
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = field(default=None, repr=False)
    # With SamplingParams.prompt_logprobs: one entry per prompt token (None for the first), on every output
    # from the first on (as vLLM's cumulative and final outputs). None without it.
    prompt_logprobs: PromptLogprobs | None = None
