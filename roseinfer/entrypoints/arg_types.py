"""argparse types shared by `roseinfer generate` and the benchmarks: a bad value is an argparse error naming
the flag (exit 2), not a traceback from deep in the engine."""

from __future__ import annotations

import argparse
import math

import torch


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from e
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (token counts, request counts, warm-up sizes)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (min_tokens)."""
    return _int_at_least(text, 0)


def logprob_count(text: str) -> int:
    """How many logprobs a position: an integer >= 0, or -1 for the whole vocabulary."""
    return _int_at_least(text, -1)


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from e
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def additive_penalty(text: str) -> float:
    """A number in [-2, 2] (presence and frequency penalties, as vLLM)."""
    value = _finite_float(text)
    if not -2.0 <= value <= 2.0:
        raise argparse.ArgumentTypeError(f"must be in [-2, 2], got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (the repetition penalty)."""
    value = _finite_float(text)
    if value <= 0.0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (a size in GiB)."""
    value = _finite_float(text)
    if value < 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def memory_fraction(text: str) -> float:
    """A share of the GPU's memory in (0, 1] (gpu_memory_utilization)."""
    value = _finite_float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def arrival_rates(text: str) -> list[float]:
    """Request rates in req/s, separated by commas or spaces, each > 0; `inf` sends every request at once (as
    vLLM's benchmark's default rate does)."""
    try:
        rates = [float(t) for t in text.replace(" ", ",").split(",") if t]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from e
    if not rates or not all(r > 0 for r in rates):  # NaN fails too
        raise argparse.ArgumentTypeError(f"rates must be positive, got {text!r}")
    return rates


def token_ids(text: str) -> list[int]:
    """Comma- (or space-) separated token ids >= 0."""
    try:
        ids = [int(t) for t in text.replace(" ", ",").split(",") if t]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e
    if any(t < 0 for t in ids):
        raise argparse.ArgumentTypeError(f"token ids must be >= 0, got {text!r}")
    return ids


def truncate_count(text: str) -> int:
    """How many prompt tokens to keep: an integer >= 1, or -1 for the model's context length."""
    value = _int_at_least(text, -1)
    if value == 0:
        raise argparse.ArgumentTypeError("must be >= 1 or -1, got 0")
    return value


def logit_bias_map(text: str) -> dict[int, float]:
    """Comma-separated ID=BIAS pairs: token ids >= 0, finite biases."""
    bias: dict[int, float] = {}
    for pair in (p for p in text.replace(" ", ",").split(",") if p):
        key, sep, value = pair.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected ID=BIAS pairs, got {pair!r}")
        token = _int_at_least(key, 0)
        bias[token] = _finite_float(value)
    if not bias:
        raise argparse.ArgumentTypeError(f"expected ID=BIAS pairs, got {text!r}")
    return bias


def power_of_two(text: str) -> int:
    """A power of two >= 1 (the KV block size)."""
    value = positive_int(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two, got {value}")
    return value


def torch_device(text: str) -> str:
    """A name `torch.device` takes ("cpu", "cuda", "cuda:1")."""
    try:
        torch.device(text)
    except (RuntimeError, TypeError) as e:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r}") from e
    return text
