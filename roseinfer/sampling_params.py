"""SamplingParams: validated at construction; every bad value is a ValueError naming field and limit."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from numbers import Integral, Real


class RequestOutputKind(Enum):
    """What `LLMEngine.step` returns for a request, as vLLM v1's: CUMULATIVE, each output holding everything so
    far; DELTA, only what is new since the request's previous output; FINAL_ONLY, only the finished output."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


def _plain_int(value: object) -> object:
    """numpy and other integral scalars as a plain int (bools stay as they are); anything else unchanged."""
    return int(value) if isinstance(value, Integral) and not isinstance(value, bool) else value


def is_int(value: object) -> bool:
    """An int that is not a bool (bool is an int subclass: True must not pass for a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _plain_float(value: object) -> object:
    """numpy and other real scalars as a plain float (bools stay as they are); anything else unchanged."""
    return float(value) if isinstance(value, Real) and not isinstance(value, bool) else value


def _token_id_key(key: object) -> object:
    """A logit_bias key as a token id: JSON gives string keys ("50256"), which name the id `int` reads in them,
    as vLLM's `int(token_id)`; a string that holds no integer stays a string (refused by name)."""
    if isinstance(key, str):
        try:
            return int(key)
        except ValueError:
            return key
    return _plain_int(key)


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
    # As vLLM v1 (`logit_controls.py` applies them, before min_tokens' mask and the penalties): only these ids
    # may be sampled (every other logit -inf); each id in [0, vocab), checked at the engine's front door.
    allowed_token_ids: list[int] | None = None
    # As vLLM v1: added to the logits of these ids (finite floats; ids checked against the vocabulary at the
    # front door). Not clamped: vLLM's OpenAI server clamps to [-100, 100], its offline API does not.
    logit_bias: dict[int, float] | None = None
    # As vLLM v1: each word, tokenized without special tokens as is and with a leading space, is a token
    # sequence whose last token is banned wherever the output so far ends with the rest (`Request`). Needs a
    # tokenizer.
    bad_words: list[str] | None = None
    # As vLLM: keep only the last k prompt tokens (k >= 1; -1: the model's max length), before the prompt's
    # length is checked.
    truncate_prompt_tokens: int | None = None
    # As vLLM v1: what each output of the request holds (`RequestOutputKind`). `LLM.generate` runs its
    # requests as FINAL_ONLY, whatever is asked here.
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # As vLLM v1: False leaves every output's text empty and its logprobs' decoded tokens None (the token
    # ids are still there); stop strings need it True.
    detokenize: bool = True
    # As vLLM v1 with special tokens kept (skip_special_tokens=False): False puts nothing between two added
    # tokens in a row, where the tokenizer's decoder would (a WordPiece decoder puts a space).
    spaces_between_special_tokens: bool = True

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
        if not is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 0, got {self.top_k}")
        if self.max_tokens is not None and (not is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens}")
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < -1):
                raise ValueError(
                    f"{name} must be None, an int >= 0, or -1 (the whole vocabulary), got {value!r}"
                )
        if not is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.seed is not None and not is_int(self.seed):
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
        self._check_logit_controls()
        self._check_output_fields()

    def _check_output_fields(self) -> None:
        """output_kind, detokenize and spaces_between_special_tokens: their types, and stop strings' need of
        detokenization."""
        if not isinstance(self.output_kind, RequestOutputKind):
            kinds = ", ".join(f"RequestOutputKind.{k.name}" for k in RequestOutputKind)
            raise ValueError(f"output_kind must be one of {kinds}, got {self.output_kind!r}")
        for name in ("detokenize", "spaces_between_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True (their text is what is searched)")

    def _check_logit_controls(self) -> None:
        """allowed_token_ids, logit_bias, bad_words and truncate_prompt_tokens: their types and ranges that need
        no vocabulary (`LLMEngine.validate` checks the ids against it)."""
        if self.allowed_token_ids is not None:
            ids = [_plain_int(t) for t in self.allowed_token_ids]
            if not ids:
                raise ValueError("allowed_token_ids must not be empty (None: every token allowed)")
            if any(not is_int(t) or t < 0 for t in ids):
                raise ValueError(f"allowed_token_ids must be non-negative ints, got {self.allowed_token_ids}")
            self.allowed_token_ids = ids
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}")
            bias: dict[int, float] = {}
            for key, value in self.logit_bias.items():
                tid = _token_id_key(key)
                value = _plain_float(value)
                if not is_int(tid) or tid < 0:
                    raise ValueError(f"logit_bias keys must be non-negative token ids, got {key!r}")
                if not isinstance(value, float | int) or isinstance(value, bool) or not math.isfinite(value):
                    raise ValueError(f"logit_bias values must be finite numbers, got {value!r} for {key!r}")
                bias[tid] = float(value)
            self.logit_bias = bias or None
        if self.bad_words is not None:
            words = [self.bad_words] if isinstance(self.bad_words, str) else list(self.bad_words)
            if any(not isinstance(w, str) or not w.strip() for w in words):
                raise ValueError(f"bad_words must hold non-blank strings, got {self.bad_words!r}")
            self.bad_words = words or None
        k = _plain_int(self.truncate_prompt_tokens)
        if k is not None and (not is_int(k) or not (k >= 1 or k == -1)):
            raise ValueError(
                f"truncate_prompt_tokens must be an int >= 1 or -1, got {self.truncate_prompt_tokens!r}"
            )
        self.truncate_prompt_tokens = k

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5 or self.top_k == 1

    @property
    def has_logit_controls(self) -> bool:
        """It masks or biases logits beyond min_tokens: its rows sample outside the decode graph."""
        return bool(self.allowed_token_ids or self.logit_bias or self.bad_words)

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)
