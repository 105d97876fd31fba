"""The reference for `LLM.beam_search`: vLLM's offline beam search spelled out in plain Python over HF
transformers' float32 model, each candidate's logprobs from a whole-sequence forward (no paged cache, no
scheduler, no sampler)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch


@dataclass
class RefBeam:
    tokens: list[int]
    cum_logprob: float
    finish_reason: str


def score(tokens: list[int], cum: float, eos: Collection[int], length_penalty: float) -> float:
    """cum / length ** length_penalty, the length counting the prompt and not a final eos."""
    length = len(tokens) - (1 if tokens[-1] in eos else 0)
    return cum / length**length_penalty


def next_logprobs(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, -1]
    return torch.log_softmax(logits.double(), dim=-1)


def reference_beam_search(
    model: torch.nn.Module,
    prompt: list[int],
    width: int,
    max_tokens: int,
    eos: Collection[int],
    ignore_eos: bool = False,
    length_penalty: float = 1.0,
    include_eos: bool = False,
) -> list[RefBeam]:
    """Greedy rounds: each live beam's 2 * width most likely next tokens are its candidates; an eos one
    completes (its eos kept in the tokens only with `include_eos`), the `width` best others by score live on;
    the completed and live beams together, best `width` by score, are the result."""
    live = [RefBeam(list(prompt), 0.0, "length")]
    done: list[RefBeam] = []
    for _ in range(max_tokens):
        if not live:
            break
        candidates = []
        for beam in live:
            values, ids = torch.topk(next_logprobs(model, beam.tokens), 2 * width)
            for token, value in zip(ids.tolist(), values.tolist(), strict=True):
                cum = beam.cum_logprob + value
                if token in eos and not ignore_eos:
                    done.append(RefBeam(beam.tokens + [token] if include_eos else beam.tokens, cum, "stop"))
                else:
                    candidates.append(RefBeam(beam.tokens + [token], cum, "length"))
        candidates.sort(key=lambda b: score(b.tokens, b.cum_logprob, eos, length_penalty), reverse=True)
        live = candidates[:width]
    ranked = sorted(
        done + live, key=lambda b: score(b.tokens, b.cum_logprob, eos, length_penalty), reverse=True
    )
    return ranked[:width]
