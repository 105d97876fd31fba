"""The reference for the logit controls' engine tests: the engine's own model over the whole sequence (prompt and
generated tokens) as one prefill, with no sampler, scheduler or graph; at each generated position its logits
controlled in plain Python (allowed ids, bad words, logit bias, penalties, in vLLM v1's order) and the argmax
taken. A greedy run must pick that argmax (where the two best are within float32 rounding, either)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from roseinfer import LLM, SamplingParams
from tests.engine.test_penalties import penalize
from tests.models.test_hf_parity import engine_prefill_logits

TOL = 1e-4
NEG = float("-inf")


def reference_banned(words: Sequence[Sequence[int]], output: Sequence[int]) -> set[int]:
    """vLLM v1's rule, spelled out: a word's last token is banned where the output ends with the rest."""
    banned = set()
    for w in words:
        prefix = list(w[:-1])
        if len(prefix) <= len(output) and (not prefix or list(output[len(output) - len(prefix) :]) == prefix):
            banned.add(w[-1])
    return banned


def control(
    row: list[float],
    prompt: list[int],
    output: list[int],
    sp: SamplingParams,
    words: Sequence[Sequence[int]] = (),
    eos: Sequence[int] = (),
) -> list[float]:
    out = list(row)
    if sp.allowed_token_ids:
        allowed = set(sp.allowed_token_ids)
        out = [x if t in allowed else NEG for t, x in enumerate(out)]
    for t in reference_banned(words, output):
        out[t] = NEG
    if len(output) < sp.min_tokens:  # min_tokens: the stop ids and eos, even under ignore_eos
        for t in [*sp.stop_token_ids, *eos]:
            out[t] = NEG
    for t, b in (sp.logit_bias or {}).items():
        out[t] += b
    return penalize(out, prompt, output, sp) if sp.has_penalties else out


def check_greedy(
    llm: LLM, prompt: list[int], tokens: list[int], sp: SamplingParams, words: Sequence[Sequence[int]] = ()
) -> int:
    """Each token is the reference's argmax at its position; returns how many positions the controls decided
    (where the plain argmax differs)."""
    logits = engine_prefill_logits(llm, prompt + tokens[:-1])[len(prompt) - 1 :].double().tolist()
    decided = 0
    for i, row in enumerate(logits):
        ref = control(row, prompt, tokens[:i], sp, words, llm.engine.eos_token_ids)
        best = int(np.argmax(ref))
        assert ref[tokens[i]] > NEG, (i, tokens, "drew a masked token")
        assert tokens[i] == best or ref[best] - ref[tokens[i]] < TOL, (i, tokens, best)
        decided += int(np.argmax(row)) != best
    return decided
