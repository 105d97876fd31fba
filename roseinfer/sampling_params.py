"""SamplingParams: validated at construction; every bad value is a ValueError naming field and limit."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real


def _plain_int(value: object) -> object:
    """numpy and other integral scalars as a plain int (bools stay as they are); anything else unchanged."""
    return int(value) if isinstance(value, Integral) and not isinstance(value, bool) else value


def _plain_float(value: object) -> object:
    """numpy and other real scalars as a plain float (bools stay as they are); anything else unchanged."""
    return float(value) if isinstance(value, Real) and not isinstance(value, bool) else value


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0): no top-k
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = (
        16  # None: as many as the context (and the KV cache) leave, resolved at admission
    )
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: int = 1
    include_stop_str_in_output: bool = False
    # As vLLM v1: until a sequence has generated min_tokens tokens, its stop token ids and the eos ids
    # (even under ignore_eos) are not sampled, and no stop string that ends in the first min_tokens
    # tokens' text stops it. After the older fields, so that they keep their positions.
    min_tokens: int = 0
    # As vLLM v1: for each generated token, the logprobs of the sampled token and of the `logprobs` most likely
    # ones (-1: the whole vocabulary), from the log_softmax of the raw logits (before temperature, min_tokens,
    # min-p, top-k, top-p): CompletionOutput.logprobs and cumulative_logprob. None: off.
    logprobs: int | None = None
    # As vLLM v1: for each prompt token after the first, the logprobs of that token and of the `prompt_logprobs`
    # most likely ones (-1: the whole vocabulary) at the position before it, from the raw logits' log_softmax:
    # RequestOutput.prompt_logprobs. None: off.
    prompt_logprobs: int | None = None
    # As vLLM v1, per sample, after min_tokens' mask and before temperature: each token id seen in the prompt or
    # the sample's output so far has its logit divided by repetition_penalty where positive, else multiplied by
    # it; then each logit loses frequency_penalty times its id's count in the output, and presence_penalty if
    # that count is not 0. Greedy samples too. 0.0, 0.0 and 1.0: off.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        for name in ("top_k", "max_tokens", "min_tokens", "n", "seed", "logprobs", "prompt_logprobs"):
            setattr(self, name, _plain_int(getattr(self, name)))
        for name in (
            "temperature",
            "top_p",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        ):
            value = _plain_float(getattr(self, name))
            setattr(self, name, value)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if math.isnan(value) or math.isinf(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 0, got {self.top_k}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens}")
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < -1):
                raise ValueError(
                    f"{name} must be None, an int >= 0, or -1 (the whole vocabulary), got {value!r}"
                )
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ValueError(f"seed must be in [-2**63, 2**64) (a torch generator seed), got {self.seed}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop must hold non-empty strings")
        self.stop_token_ids = [_plain_int(t) for t in self.stop_token_ids or []]  # type: ignore[misc]
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids}")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)
