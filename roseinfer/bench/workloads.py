"""The standard synthetic workloads of WORKLOADS.md (W1, W2, W4, W5), as token-id prompts + SamplingParams.

Token ids are drawn uniformly from `[1000, min(vocab, 32000))` with `numpy.random.default_rng(seed)`.
Draw order, so that any other implementation reproduces the same prompts: first every length the
workload draws (prompt lengths, then output lengths), then the prompts' token ids, prompt by prompt.

`num_requests`, `max_prompt_len` and `max_output_len` shrink a workload for quick (CPU) runs. A
shrunk workload keeps its id but is flagged `scaled`, and reports must say so: its figures are not
comparable with the standard ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roseinfer.sampling_params import SamplingParams

TOKEN_ID_LOW = 1000
TOKEN_ID_HIGH = 32000


@dataclass(frozen=True)
class Workload:
    id: str
    description: str
    prompts: list[list[int]]
    params: list[SamplingParams]
    seed: int = 0
    scaled: bool = False  # shrunk by an override: not comparable with the standard figures
    # Engine settings the workload prescribes (e.g. W5's block size 64); explicit user options win.
    engine_overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.params):
            raise ValueError(f"{len(self.prompts)} prompts but {len(self.params)} sampling params")

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def prompt_lens(self) -> list[int]:
        return [len(p) for p in self.prompts]

    @property
    def output_lens(self) -> list[int]:
        return [p.max_tokens for p in self.params]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(self.prompt_lens)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def max_len(self) -> int:
        """Longest prompt + output of any request: the context the engine must allow."""
        return max(len(p) + s.max_tokens for p, s in zip(self.prompts, self.params))

    def head(self, n: int) -> Workload:
        """The first `n` requests (e.g. for a warm-up)."""
        return Workload(
            self.id,
            self.description,
            self.prompts[:n],
            self.params[:n],
            self.seed,
            True,
            dict(self.engine_overrides),
        )

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "description": self.description,
            "num_requests": self.num_requests,
            "prompt_tokens": self.num_prompt_tokens,
            "output_tokens": self.num_output_tokens,
            "seed": self.seed,
            "scaled": self.scaled,
            "engine_overrides": dict(self.engine_overrides),
        }


@dataclass(frozen=True)
class Limits:
    """Optional shrinking of a workload; None keeps the standard value."""

    num_requests: int | None = None
    max_prompt_len: int | None = None
    max_output_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_requests", "max_prompt_len", "max_output_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.num_requests, self.max_prompt_len, self.max_output_len))


def token_id_range(vocab_size: int) -> tuple[int, int]:
    high = min(vocab_size, TOKEN_ID_HIGH)
    low = TOKEN_ID_LOW if high > TOKEN_ID_LOW else 0  # toy vocabularies: use all of it
    return low, high


def _count(standard: int, limit: int | None) -> int:
    return standard if limit is None else min(standard, limit)


def _fixed_len(standard: int, cap: int | None) -> int:
    return standard if cap is None else min(standard, cap)


def _len_range(low: int, high: int, cap: int | None) -> tuple[int, int]:
    """Inclusive range U[low, high], scaled down proportionally when `cap` < high."""
    if cap is None or cap >= high:
        return low, high
    return max(1, round(low * cap / high)), cap


def _random_prompts(rng: np.random.Generator, lens: list[int], vocab_size: int) -> list[list[int]]:
    low, high = token_id_range(vocab_size)
    return [rng.integers(low, high, size=n).tolist() for n in lens]


def _params(output_lens: list[int], temperature: float) -> list[SamplingParams]:
    return [SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True) for n in output_lens]


def w1_fixed(vocab_size: int, limits: Limits | None = None, seed: int = 0) -> Workload:
    limits = limits or Limits()
    n = _count(64, limits.num_requests)
    plen = _fixed_len(512, limits.max_prompt_len)
    olen = _fixed_len(128, limits.max_output_len)
    rng = np.random.default_rng(seed)
    return Workload(
        "W1",
        f"{n} requests x {plen} prompt tokens, {olen} output tokens, greedy",
        _random_prompts(rng, [plen] * n, vocab_size),
        _params([olen] * n, 0.0),
        seed,
        limits.any,
    )


def w2_mixed(vocab_size: int, limits: Limits | None = None, seed: int = 0) -> Workload:
    limits = limits or Limits()
    n = _count(256, limits.num_requests)
    p_lo, p_hi = _len_range(100, 1024, limits.max_prompt_len)
    o_lo, o_hi = _len_range(100, 1024, limits.max_output_len)
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(p_lo, p_hi + 1, size=n).tolist()
    output_lens = rng.integers(o_lo, o_hi + 1, size=n).tolist()
    return Workload(
        "W2",
        f"{n} requests, prompt ~ U[{p_lo},{p_hi}], output ~ U[{o_lo},{o_hi}], temperature 0.6",
        _random_prompts(rng, prompt_lens, vocab_size),
        _params(output_lens, 0.6),
        seed,
        limits.any,
    )


def _identical(
    wid: str,
    vocab_size: int,
    limits: Limits,
    seed: int,
    n: int,
    plen: int,
    olen: int,
    overrides: dict[str, Any],
) -> Workload:
    n = _count(n, limits.num_requests)
    plen = _fixed_len(plen, limits.max_prompt_len)
    olen = _fixed_len(olen, limits.max_output_len)
    rng = np.random.default_rng(seed)
    prompt = _random_prompts(rng, [plen], vocab_size)[0]
    return Workload(
        wid,
        f"{n} identical prompts of {plen} tokens, {olen} output tokens, greedy",
        [list(prompt) for _ in range(n)],
        _params([olen] * n, 0.0),
        seed,
        limits.any,
        overrides,
    )


def w4_repeated_prompt(vocab_size: int, limits: Limits | None = None, seed: int = 0) -> Workload:
    limits = limits or Limits()
    return _identical("W4", vocab_size, limits, seed, 64, 856, 16, {})


def w5_cow(vocab_size: int, limits: Limits | None = None, seed: int = 0) -> Workload:
    limits = limits or Limits()
    # Block size 64: the 65-token prompt ends in one shared, partly filled block. Max batch 16.
    return _identical("W5", vocab_size, limits, seed, 512, 65, 2, {"block_size": 64, "max_num_seqs": 16})


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "W1": w1_fixed,
    "W2": w2_mixed,
    "W4": w4_repeated_prompt,
    "W5": w5_cow,
}


def build_workload(
    workload_id: str,
    vocab_size: int,
    *,
    num_requests: int | None = None,
    max_prompt_len: int | None = None,
    max_output_len: int | None = None,
    seed: int = 0,
) -> Workload:
    key = workload_id.upper()
    if key not in WORKLOADS:
        raise ValueError(f"unknown workload {workload_id!r}; available: {', '.join(WORKLOADS)}")
    return WORKLOADS[key](vocab_size, Limits(num_requests, max_prompt_len, max_output_len), seed)
