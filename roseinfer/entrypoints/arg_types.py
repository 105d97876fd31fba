"""argparse types shared by `roseinfer generate` and the benchmarks: a bad value is an argparse error naming
the flag (exit 2), not a traceback from deep in the engine."""

from __future__ import annotations

import argparse

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


def token_ids(text: str) -> list[int]:
    """Comma- (or space-) separated token ids >= 0."""
    try:
        ids = [int(t) for t in text.replace(" ", ",").split(",") if t]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e
    if any(t < 0 for t in ids):
        raise argparse.ArgumentTypeError(f"token ids must be >= 0, got {text!r}")
    return ids


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
