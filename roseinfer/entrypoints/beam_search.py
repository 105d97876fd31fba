"""`LLM.beam_search`: vLLM's offline beam search, run as rounds of one-token requests through the engine.

Each round every live beam of every prompt runs as one request (its tokens so far as the prompt, one token,
`2 * beam_width` logprobs), all in one `generate` call, so the prefix cache serves what the beams share. Each
beam's position dict (the sampled token and the top `2 * beam_width`, raw logprobs) gives its candidates:
those ending in an eos id (unless `ignore_eos`) complete, the best `beam_width` of the rest, by the
length-penalised score, live on. At the end the completed and live beams together are ranked by that score
and the best `beam_width` returned."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from roseinfer.engine.llm_engine import unpack_prompt
from roseinfer.logprobs import Logprob
from roseinfer.sampling_params import RequestOutputKind, SamplingParams, is_int

if TYPE_CHECKING:
    from roseinfer.entrypoints.llm import LLM


@dataclass
class BeamSearchParams:
    """As vLLM's: `beam_width` beams kept each round, up to `max_tokens` rounds; `temperature` for the token
    each round's requests sample (the candidates come from the raw logprobs whatever it is); `length_penalty`
    the exponent of the length that divides a beam's cumulative logprob in its score;
    `include_stop_str_in_output` keeps the eos id that completed a beam in its tokens (and text)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("temperature", "length_penalty"):
            value = getattr(self, name)
            if not isinstance(value, Real) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            setattr(self, name, float(value))
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")


@dataclass
class BeamSearchSequence:
    """One beam: `tokens` are the prompt's then the generated ids; `logprobs` one position dict per round it
    ran (a beam completed by an eos id left out of its tokens keeps that round's dict); `text` the tokens
    decoded (None without a tokenizer)."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" (an eos id), "length" (max_tokens rounds)
    stop_reason: int | None = None  # the eos id that completed it


@dataclass
class BeamSearchOutput:
    """The best `beam_width` beams of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def beam_search_score(
    tokens: Sequence[int], cum_logprob: float, eos_token_ids: Sequence[int], length_penalty: float
) -> float:
    """As vLLM's (after HF transformers'): the cumulative logprob over the length to the power
    `length_penalty`, where the length counts the prompt's tokens too and not a final eos id."""
    length = len(tokens) - (1 if tokens and tokens[-1] in eos_token_ids else 0)
    return cum_logprob / length**length_penalty


@dataclass
class _Instance:
    """One prompt's search: its live beams and those completed."""

    prompt: list[int]
    cache_salt: str | None
    beams: list[BeamSearchSequence]
    completed: list[BeamSearchSequence] = field(default_factory=list)


def run_beam_search(
    llm: LLM, prompts: Sequence[Any], params: BeamSearchParams, use_tqdm: bool = False
) -> list[BeamSearchOutput]:
    if not isinstance(params, BeamSearchParams):
        raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
    engine = llm.engine
    width = params.beam_width
    # Detokenizing each round's requests would decode every beam's whole prompt again: the dicts' tokens get
    # their text once, for the returned beams only.
    probe = SamplingParams(
        temperature=params.temperature,
        max_tokens=1,
        logprobs=2 * width,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    try:
        engine.check_logprobs(probe)
    except ValueError as e:
        raise ValueError(
            f"beam_width={width} takes {2 * width} logprobs a token (2 * beam_width): {e}"
        ) from e
    instances = []
    for i, prompt in enumerate(prompts):
        inner, salt = unpack_prompt(prompt)
        try:
            # The whole search's length up front: a beam must never outgrow the context mid-search.
            ids, _ = engine.validate(inner, SamplingParams(max_tokens=params.max_tokens, logprobs=2 * width))
        except ValueError as e:
            raise ValueError(f"beam search prompt {i}: {e}") from e
        instances.append(_Instance(ids, salt, [BeamSearchSequence(ids)]))
    eos = frozenset(engine.eos_token_ids)

    def score(beam: BeamSearchSequence) -> float:
        return beam_search_score(beam.tokens, beam.cum_logprob, eos, params.length_penalty)

    rounds = tqdm(range(params.max_tokens), desc="beam search", unit="tok", disable=not use_tqdm)
    for _ in rounds:
        live = [(inst, beam) for inst in instances for beam in inst.beams]
        if not live:
            break
        batch = [{"prompt_token_ids": beam.tokens, "cache_salt": inst.cache_salt} for inst, beam in live]
        outs = llm.generate(batch, probe, use_tqdm=False)
        start = 0
        for inst in instances:
            runs = outs[start : start + len(inst.beams)]
            start += len(inst.beams)
            _advance(inst, [o.outputs[0].logprobs[0] for o in runs], eos, params)  # type: ignore[index]
    rounds.close()
    results = []
    for inst in instances:
        for beam in inst.beams:
            beam.finish_reason = "length"
        best = sorted(inst.completed + inst.beams, key=score, reverse=True)[:width]
        for beam in best:
            _add_text(llm, beam)
        results.append(BeamSearchOutput(best))
    return results


def _advance(
    inst: _Instance, dicts: list[dict[int, Logprob]], eos: frozenset[int], params: BeamSearchParams
) -> None:
    """One round of one prompt: each live beam's candidates from its position dict (in the dict's order: the
    sampled token, then by rank), eos completions set aside, the best `beam_width` others by score kept (a
    stable sort: ties keep that order). Only the kept candidates get token lists of their own."""
    candidates = []
    for beam, position in zip(inst.beams, dicts, strict=True):
        length = len(beam.tokens) + 1
        for token, entry in position.items():
            cum = beam.cum_logprob + entry.logprob
            if token in eos and not params.ignore_eos:
                tokens = beam.tokens + [token] if params.include_stop_str_in_output else list(beam.tokens)
                inst.completed.append(
                    BeamSearchSequence(tokens, beam.logprobs + [position], cum, None, "stop", token)
                )
            else:
                # The score of beam.tokens + [token], without building that list.
                value = cum / (length - (token in eos)) ** params.length_penalty
                candidates.append((value, cum, token, beam, position))
    candidates.sort(key=lambda c: c[0], reverse=True)
    inst.beams = [
        BeamSearchSequence(beam.tokens + [token], beam.logprobs + [position], cum)
        for _, cum, token, beam, position in candidates[: params.beam_width]
    ]


def _add_text(llm: LLM, beam: BeamSearchSequence) -> None:
    """The beam's tokens decoded, prompt included (as vLLM's offline `beam_search`), and each dict entry's
    token text; nothing without a tokenizer."""
    engine = llm.engine
    if engine.tokenizer is None:
        return
    beam.text = engine.tokenizer.decode(beam.tokens)
    for position in beam.logprobs:
        for token, entry in position.items():
            if entry.decoded_token is None:
                entry.decoded_token = engine.token_text(token)
