"""`SamplingParams.allowed_token_ids`, `logit_bias` and `truncate_prompt_tokens`, as in vLLM v1, end to end on the
CPU torch backend, against the whole-sequence reference of `logit_reference.py`; with async scheduling on and
off, eager and with CPU replays of the decode and mixed-step graphs, greedy and seeded, n > 1."""

from __future__ import annotations

from dataclasses import replace

import pytest

from roseinfer import SamplingParams
from tests.engine.greedy_kinds import check_kinds_against_the_reference
from tests.engine.logit_reference import check_greedy
from tests.engine.test_min_tokens import PROMPTS, count_calls, make, prefer

FAVOURITE = 77
ALLOWED = [3, 50, 101, 202, 383]
BIAS = {5: 6.0, 9: 4.0, FAVOURITE: -30.0, 300: 2.5}

KINDS = {
    "allowed": dict(allowed_token_ids=ALLOWED),
    "bias": dict(logit_bias=BIAS),
    "allowed+bias": dict(allowed_token_ids=ALLOWED, logit_bias={3: -3.0, 383: 5.0}),
    "all": dict(
        allowed_token_ids=ALLOWED + [FAVOURITE],
        logit_bias={50: 1.5, FAVOURITE: -1.0},
        repetition_penalty=1.5,
        frequency_penalty=0.4,
        min_tokens=3,
        stop_token_ids=[101],
    ),
}


def greedy(max_tokens: int = 12, **kw) -> SamplingParams:
    kw.setdefault("ignore_eos", True)
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def check_all(llm, prompts, outs, params) -> int:
    decided = 0
    for prompt, out, sp in zip(prompts, outs, params):
        assert len(out.outputs) == sp.n
        for c in out.outputs:
            if not sp.stop_token_ids:
                assert len(c.token_ids) == sp.max_tokens
            decided += check_greedy(llm, prompt, c.token_ids, sp)
    return decided


# -- validation -----------------------------------------------------------------------------------


def test_params_are_validated():
    sp = SamplingParams(allowed_token_ids=(1, 2), logit_bias={"7": 1, 3: -2.5}, truncate_prompt_tokens=-1)
    assert sp.allowed_token_ids == [1, 2] and sp.logit_bias == {7: 1.0, 3: -2.5}
    assert sp.has_logit_controls and not SamplingParams().has_logit_controls
    assert SamplingParams(bad_words="x").bad_words == ["x"]
    bad = [
        ("allowed_token_ids", []),
        ("allowed_token_ids", [-1]),
        ("allowed_token_ids", [1.5]),
        ("allowed_token_ids", [True]),
        ("logit_bias", {1: float("inf")}),
        ("logit_bias", {1: float("nan")}),
        ("logit_bias", {-3: 1.0}),
        ("logit_bias", {1: "2"}),
        ("logit_bias", [1, 2]),
        ("bad_words", ["ok", ""]),
        ("bad_words", [3]),
        ("truncate_prompt_tokens", 0),
        ("truncate_prompt_tokens", -2),
        ("truncate_prompt_tokens", 2.0),
    ]
    for name, value in bad:
        with pytest.raises(ValueError, match=name):
            SamplingParams(**{name: value})


def test_the_front_door_checks_ids_against_the_vocabulary(llama_dir):
    llm = make(llama_dir)
    vocab = llm.engine.model_config.vocab_size
    for name, value in [("allowed_token_ids", [1, vocab]), ("logit_bias", {vocab + 5: 1.0})]:
        with pytest.raises(ValueError, match=name):
            llm.generate([[1, 2]], SamplingParams(**{name: value}), use_tqdm=False)
    with pytest.raises(ValueError, match="bad_words need a tokenizer"):
        llm.generate([[1, 2]], SamplingParams(bad_words=["x"]), use_tqdm=False)
    assert (
        llm.generate([[1, 2]], greedy(2, allowed_token_ids=[vocab - 1]), use_tqdm=False)[0]
        .outputs[0]
        .token_ids
        == [vocab - 1] * 2
    )


# -- greedy against the reference -----------------------------------------------------------------


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_greedy_with_controls_matches_the_reference(llama_dir, async_scheduling, graphs):
    """Each kind alone over all prompts, then one batch mixing every kind with rows that have none; rows
    without controls give what they give alone."""
    llm = make(llama_dir, async_scheduling, graphs)
    check_kinds_against_the_reference(llm, list(KINDS.values()), greedy, check_all, 40, graphs)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_bias_overrides_the_favourite_and_allowed_ids_exclude_it(llama_dir, async_scheduling):
    llm = make(llama_dir, async_scheduling, graphs=True)
    prefer(llm, FAVOURITE)
    assert all(
        o.outputs[0].token_ids == [FAVOURITE] * 6 for o in llm.generate(PROMPTS, greedy(6), use_tqdm=False)
    )
    outs = llm.generate(PROMPTS, greedy(6, logit_bias={FAVOURITE: -100.0, 12: 90.0}), use_tqdm=False)
    assert all(o.outputs[0].token_ids == [12] * 6 for o in outs)
    outs = llm.generate(PROMPTS, greedy(6, allowed_token_ids=[4, 8]), use_tqdm=False)
    assert all(set(o.outputs[0].token_ids) <= {4, 8} for o in outs)
    sp = greedy(6, allowed_token_ids=[4, 8])
    check_all(llm, PROMPTS, outs, [sp] * len(PROMPTS))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_n_greedy_samples_follow_the_reference(llama_dir, async_scheduling):
    llm = make(llama_dir, async_scheduling, graphs=True)
    sp = replace(greedy(10, **KINDS["all"]), n=3)
    outs = llm.generate(PROMPTS, sp, use_tqdm=False)
    for out in outs:
        first, *others = [c.token_ids for c in out.outputs]
        assert all(ids == first for ids in others)
    assert check_all(llm, PROMPTS, outs, [sp] * len(PROMPTS)) > 0


# -- sampled ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [None, 11])
def test_sampled_rows_draw_only_allowed_ids_and_seeds_repeat(llama_dir, seed):
    """Temperature, top-k and min-p rows with n = 3 draw only allowed ids, however the steps run; a seeded
    request draws the same tokens with async scheduling on and off, eager and with graphs."""
    prompts = PROMPTS[1:5]
    kinds = [dict(temperature=1.5), dict(temperature=1.0, top_k=3), dict(temperature=1.0, min_p=0.01)]
    results = []
    for async_scheduling, graphs in [(False, False), (True, False), (True, True)]:
        llm = make(llama_dir, async_scheduling, graphs)
        got = []
        for kind in kinds:
            sp = SamplingParams(
                seed=seed,
                n=3,
                max_tokens=10,
                ignore_eos=True,
                allowed_token_ids=ALLOWED,
                logit_bias={3: -2.0},
                **kind,
            )
            for out in llm.generate(prompts, sp, use_tqdm=False):
                for c in out.outputs:
                    assert len(c.token_ids) == 10 and set(c.token_ids) <= set(ALLOWED), c.token_ids
                got.append([c.token_ids for c in out.outputs])
        drawn = {t for sample in got for ids in sample for t in ids}
        assert len(drawn) >= 3  # the draws spread over the allowed ids
        results.append(got)
    if seed is not None:
        assert results[0] == results[1] == results[2]


def test_control_steps_sample_outside_the_graph_and_others_as_before(llama_dir, monkeypatch):
    llm = make(llama_dir, True, graphs=True)
    runner = llm.engine.core.runner
    outside = count_calls(monkeypatch, "sample")
    llm.generate([PROMPTS[3]], greedy(8), use_tqdm=False)
    assert len(outside) == 1 and runner.step_paths["decode_graph"] == 7
    for kind in KINDS.values():
        outside.clear()
        llm.generate([PROMPTS[3]], greedy(8, **kind), use_tqdm=False)
        assert len(outside) == 8


# -- truncate_prompt_tokens -------------------------------------------------------------------------


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_truncate_prompt_tokens_keeps_the_last_k(llama_dir, async_scheduling):
    llm = make(llama_dir, async_scheduling, max_model_len=64)
    long = [11 + i % 300 for i in range(90)]  # longer than the context: only its truncation fits
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([long], greedy(4), use_tqdm=False)
    for k in (1, 5, 40):
        out = llm.generate([long], greedy(4, truncate_prompt_tokens=k), use_tqdm=False)[0]
        assert out.prompt_token_ids == long[-k:]
        plain = llm.generate([long[-k:]], greedy(4), use_tqdm=False)[0]
        assert out.outputs[0].token_ids == plain.outputs[0].token_ids
    short = PROMPTS[5]
    for k in (-1, len(short), 64):
        assert (
            llm.generate([short], greedy(2, truncate_prompt_tokens=k), use_tqdm=False)[0].prompt_token_ids
            == short
        )
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        llm.generate([short], greedy(2, truncate_prompt_tokens=65), use_tqdm=False)
    # -1 keeps max_model_len tokens, which leave no room to generate: the length check still applies
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([long], greedy(2, truncate_prompt_tokens=-1), use_tqdm=False)
