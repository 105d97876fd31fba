"""One check the sampling-control tests share: each kind of setting alone over all prompts, then one batch mixing
every kind with rows that have none, each greedy output against its reference."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from roseinfer import LLM, SamplingParams
from tests.engine.test_min_tokens import PROMPTS


def check_kinds_against_the_reference(
    llm: LLM,
    kinds: Sequence[dict],
    greedy: Callable[..., SamplingParams],
    check_all: Callable[[LLM, list, list, list], int],
    min_decided: int,
    graphs: bool,
) -> None:
    """`check_all` checks outputs against the reference and counts the positions the settings decided: more than
    `min_decided` of them, so that ignoring the settings fails. Rows without settings, batched beside the others,
    give what they give alone; with `graphs`, both kinds of graph replayed."""
    decided = 0
    for kind in kinds:
        params = [greedy(**kind)] * len(PROMPTS)
        decided += check_all(llm, PROMPTS, llm.generate(PROMPTS, params, use_tqdm=False), params)
    mixed = [greedy(**kind) for kind in kinds] + [greedy()] * 3
    outs = llm.generate(PROMPTS, mixed, use_tqdm=False)
    decided += check_all(llm, PROMPTS, outs, mixed)
    assert decided > min_decided
    plain = llm.generate(PROMPTS[4:], greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs[4:]] == [o.outputs[0].token_ids for o in plain]
    if graphs:
        paths = llm.engine.core.runner.step_paths
        assert paths["decode_graph"] > 0 and paths["mixed_graph"] > 0
