"""Sample logprobs, in vLLM v1's shape: one dict {token id: Logprob} per generated token.

A step's sampler hands each sampled row a `TokenLogprobs`: the sampled token's id, logprob and rank, then the
batch's top-k ids and logprobs. The request keeps those (`Request.logprobs`); the engine turns each into the
dict its outputs show (`position_logprobs`), with the row's own k and each token's text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple


@dataclass
class Logprob:
    """One token's log-probability at one position, its rank there (1: the most likely) and its text (None
    without a tokenizer)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict a generated token: the sampled token first, then the position's top-k by rank.
SampleLogprobs = list[dict[int, Logprob]]
# One entry a prompt token: None for the first, then a dict as above with the prompt token in the sampled
# token's place, from the distribution at the position before it.
PromptLogprobs = list[dict[int, Logprob] | None]


class TokenLogprobs(NamedTuple):
    """What a step computed for one sampled token: `token_ids[0]` is the sampled token and `logprobs[0]` its
    logprob, `rank` its rank; the rest are the step's top-k, most likely first (k: the most any row asked)."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int


def num_logprobs(asked: int | None, vocab_size: int) -> int:
    """How many top-k logprobs `SamplingParams.logprobs` (or a `max_logprobs` cap) means: -1 is the whole
    vocabulary, None none."""
    return vocab_size if asked == -1 else asked or 0


def position_logprobs(
    raw: TokenLogprobs, num_logprobs: int, decode: Callable[[int], str] | None
) -> dict[int, Logprob]:
    """A position's dict: the sampled token with its rank, then the `num_logprobs` most likely tokens ranked
    1..num_logprobs. A sampled token among them keeps its place first and takes its top-k rank, as vLLM's
    dict does (they differ only where it ties a more likely token)."""
    ids, values = raw.token_ids, raw.logprobs
    out = {ids[0]: Logprob(values[0], raw.rank, decode(ids[0]) if decode else None)}
    for i in range(1, num_logprobs + 1):
        tid = ids[i]
        out[tid] = Logprob(values[i], i, decode(tid) if decode else None)
    return out


def prompt_position_logprobs(
    raw: list[TokenLogprobs], num_logprobs: int, decode: Callable[[int], str] | None
) -> PromptLogprobs:
    """A prompt's entries: None for its first token, then each position's dict (`position_logprobs`, the
    prompt token in the sampled token's place)."""
    return [None, *(position_logprobs(entry, num_logprobs, decode) for entry in raw)]
