"""`SamplingParams.presence_penalty`, `frequency_penalty` and `repetition_penalty`, as in vLLM v1, end to end on
the CPU torch backend.

The reference: the engine's own model run over the whole sequence (prompt and generated tokens) as one
prefill, with no sampler, scheduler or graph involved; at each generated position its logits penalized by the
rules in plain Python (the prompt and the sample's own output before that position) and the argmax taken. A
greedy engine run must pick that argmax at every position (where the two best are within float32 rounding of
each other, either)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from roseinfer import LLM, SamplingParams
from tests.engine.greedy_kinds import check_kinds_against_the_reference
from tests.engine.test_min_tokens import PROMPTS, count_calls, make, prefer
from tests.models.test_hf_parity import engine_prefill_logits

FAVOURITE = 77
TOL = 1e-4  # float32 logits of a paged, batched run against one whole-sequence forward

KINDS = {
    "presence": dict(presence_penalty=1.5),
    "frequency": dict(frequency_penalty=0.8),
    "repetition": dict(repetition_penalty=1.6),
    "combined": dict(presence_penalty=-0.5, frequency_penalty=1.2, repetition_penalty=0.7),
}


def greedy(max_tokens: int = 16, **penalties: float) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **penalties)


def penalize(logits: list[float], prompt: list[int], output: list[int], sp: SamplingParams) -> list[float]:
    out = list(logits)
    for t in set(prompt) | set(output):
        out[t] = out[t] / sp.repetition_penalty if out[t] > 0 else out[t] * sp.repetition_penalty
    for t in set(output):
        out[t] -= sp.frequency_penalty * output.count(t) + sp.presence_penalty
    return out


def reference_choices(
    llm: LLM, prompt: list[int], tokens: list[int], sp: SamplingParams
) -> list[list[float]]:
    """The reference's penalized logits at each position of `tokens` (generated after `prompt`)."""
    logits = engine_prefill_logits(llm, prompt + tokens[:-1])[len(prompt) - 1 :].double().tolist()
    return [penalize(row, prompt, tokens[:i], sp) for i, row in enumerate(logits)]


def check_greedy(llm: LLM, prompt: list[int], tokens: list[int], sp: SamplingParams) -> int:
    """Each token is the reference's argmax at its position. Returns at how many positions the argmax without
    penalties differs (where the penalties decided)."""
    decided = 0
    plain = reference_choices(llm, prompt, tokens, greedy())
    for i, row in enumerate(reference_choices(llm, prompt, tokens, sp)):
        best = int(np.argmax(row))
        assert tokens[i] == best or row[best] - row[tokens[i]] < TOL, (i, tokens, best)
        decided += int(np.argmax(plain[i])) != best
    return decided


def check_all(llm: LLM, prompts, outs, params) -> int:
    decided = 0
    for prompt, out, sp in zip(prompts, outs, params):
        assert len(out.outputs) == sp.n
        for c in out.outputs:
            assert len(c.token_ids) == sp.max_tokens
            decided += check_greedy(llm, prompt, c.token_ids, sp)
    table = llm.engine.core.runner.sampling.penalty_table
    assert table is None or not table.slot_of, "finished requests keep penalty rows"
    return decided


# -- validation -----------------------------------------------------------------------------------


def test_penalties_default_to_off_and_are_validated():
    sp = SamplingParams()
    assert (sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty) == (0.0, 0.0, 1.0)
    assert not sp.has_penalties
    for name, value in [("presence_penalty", 2.0), ("frequency_penalty", -2.0), ("repetition_penalty", 7.5)]:
        sp = SamplingParams(**{name: value})
        assert getattr(sp, name) == value and sp.has_penalties
    assert type(SamplingParams(presence_penalty=np.float32(0.5)).presence_penalty) is float
    assert SamplingParams(frequency_penalty=1).frequency_penalty == 1.0
    bad = [
        ("presence_penalty", 2.01),
        ("presence_penalty", -2.5),
        ("frequency_penalty", 3.0),
        ("frequency_penalty", -2.0001),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("repetition_penalty", float("inf")),
        ("presence_penalty", float("nan")),
        ("frequency_penalty", "1"),
        ("repetition_penalty", None),
        ("presence_penalty", True),
    ]
    for name, value in bad:
        with pytest.raises(ValueError, match=name):
            SamplingParams(**{name: value})


# -- greedy against the reference -----------------------------------------------------------------


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_greedy_with_penalties_matches_the_reference(llama_dir, async_scheduling, graphs):
    """Each kind alone, over all prompts; then one batch mixing every kind with rows that have none."""
    llm = make(llama_dir, async_scheduling, graphs)
    check_kinds_against_the_reference(llm, list(KINDS.values()), greedy, check_all, 20, graphs)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_strong_repetition_penalty_changes_greedy_output(llama_dir, async_scheduling):
    """The model prefers one token above all (greedy repeats it forever); a repetition penalty of 100 divides
    its logit once it is in the output, and another token comes next."""
    llm = make(llama_dir, async_scheduling, graphs=True)
    prefer(llm, FAVOURITE)
    off = llm.generate(PROMPTS, greedy(12), use_tqdm=False)
    assert all(o.outputs[0].token_ids == [FAVOURITE] * 12 for o in off)
    sp = greedy(12, repetition_penalty=100.0)
    outs = llm.generate(PROMPTS, sp, use_tqdm=False)
    for out in outs:
        ids = out.outputs[0].token_ids
        assert ids[0] == FAVOURITE and ids[1] != FAVOURITE, ids
    assert check_all(llm, PROMPTS, outs, [sp] * len(PROMPTS)) >= len(PROMPTS)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_frequency_penalty_lets_the_favourite_back_by_its_count(llama_dir, async_scheduling):
    """A favourite 9 logits ahead of the rest (not in the prompt), frequency 2 and presence 0.5: it is drawn
    until its penalty 2k + 0.5 eats its lead, and again once the other ids' penalties catch up; counts above 1
    decide (the reference checks every step)."""
    llm = make(llama_dir, async_scheduling, graphs=True)
    prefer(llm, FAVOURITE, bias=9.0)
    sp = greedy(16, frequency_penalty=2.0, presence_penalty=0.5)
    outs = llm.generate(PROMPTS, sp, use_tqdm=False)
    assert check_all(llm, PROMPTS, outs, [sp] * len(PROMPTS)) > 0
    assert all(o.outputs[0].token_ids.count(FAVOURITE) >= 2 for o in outs)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_each_of_n_greedy_samples_counts_its_own_output(llama_dir, async_scheduling):
    """n = 3 greedy samples fork after the prompt; each counts its own tokens, so all three are the same
    sequence, the reference's. The favourite comes first and competes again later: had the prompt's step
    counted its n draws in one sample's row, that sample would drop the favourite sooner than the others."""
    llm = make(llama_dir, async_scheduling, graphs=True)
    prefer(llm, FAVOURITE, bias=8.0)
    sp = replace(greedy(12, frequency_penalty=1.5, repetition_penalty=1.3), n=3)
    outs = llm.generate(PROMPTS, sp, use_tqdm=False)
    for out in outs:
        first, *others = [c.token_ids for c in out.outputs]
        assert first[0] == FAVOURITE and all(ids == first for ids in others), out.outputs
        assert first.count(FAVOURITE) >= 2
    assert check_all(llm, PROMPTS, outs, [sp] * len(PROMPTS)) > 0


def shift_logits(llm: LLM, by: float) -> None:
    """Every logit moved by `by` (all negative for by=-50): a large repetition penalty multiplies a seen id's
    logit to -inf in effect."""
    model = llm.engine.core.runner.model
    real = model.compute_logits
    model.compute_logits = lambda hidden: real(hidden) + by


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seed", [None, 3])
def test_each_of_n_sampled_samples_never_repeats_its_own_tokens(llama_dir, async_scheduling, seed):
    """With every logit negative and a repetition penalty of 1e4, a sample never draws an id of its prompt
    or of its own output again; without the penalty the same draws repeat ids."""
    llm = make(llama_dir, async_scheduling, graphs=True)
    shift_logits(llm, -50.0)
    prompts = PROMPTS[1:5]
    base = SamplingParams(temperature=1.0, seed=seed, n=3, max_tokens=24, ignore_eos=True)
    repeats = 0
    for out in llm.generate(prompts, base, use_tqdm=False):
        repeats += sum(len(c.token_ids) - len(set(c.token_ids)) for c in out.outputs)
    assert repeats > 0  # the test has teeth
    outs = llm.generate(prompts, replace(base, repetition_penalty=1e4), use_tqdm=False)
    firsts = set()
    for prompt, out in zip(prompts, outs):
        assert len(out.outputs) == 3
        for c in out.outputs:
            assert len(set(c.token_ids)) == len(c.token_ids) == 24 and not set(c.token_ids) & set(prompt)
        firsts |= {tuple(c.token_ids) for c in out.outputs}
    assert len(firsts) == 3 * len(prompts)  # the samples differ: each is penalized by its own tokens only


# -- cache state and preemption -------------------------------------------------------------------


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_prefix_cache_hit_gives_the_same_tokens(llama_dir, async_scheduling):
    llm = make(llama_dir, async_scheduling, graphs=True)
    shared = list(range(100, 124))
    prompts = [shared + [5 + i] * (i + 1) for i in range(4)]
    params = [greedy(**kind) for kind in KINDS.values()]
    first = llm.generate(prompts, params, use_tqdm=False)
    again = llm.generate(prompts, params, use_tqdm=False)
    assert all(o.num_cached_tokens > 0 for o in again)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in first]
    check_all(llm, prompts, again, params)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_preemption_keeps_the_counts(llama_dir, async_scheduling):
    """A KV cache of 16 blocks of 4 tokens preempts requests (recompute): resumed, each is penalized by its
    output so far (`Request.output_token_ids`, kept), not by the recomputed tokens."""
    llm = make(llama_dir, async_scheduling, graphs=True, cpu_kv_tokens=64, enable_prefix_caching=False)
    params = [greedy(24, **kind) for kind in KINDS.values()] + [greedy(24, **KINDS["combined"])] * 3
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert llm.engine.core.scheduler.num_preemptions > 0
    assert check_all(llm, PROMPTS, outs, params) > 0


# -- the sampling path ----------------------------------------------------------------------------


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_penalty_steps_sample_outside_the_graph_and_others_as_before(
    llama_dir, async_scheduling, monkeypatch
):
    """A batch with a penalty row samples every step outside the decode graph, from the logits it returns; a
    batch with none samples in the graph and never builds a penalty table."""
    llm = make(llama_dir, async_scheduling, graphs=True)
    runner = llm.engine.core.runner
    outside = count_calls(monkeypatch, "sample")
    llm.generate([PROMPTS[3]], greedy(8), use_tqdm=False)
    assert len(outside) == 1 and runner.sampling.penalty_table is None  # the prompt's step is eager
    assert runner.step_paths["decode_graph"] == 7
    outside.clear()
    llm.generate([PROMPTS[3]], greedy(8, presence_penalty=0.1), use_tqdm=False)
    # every step samples outside; the decode steps still replay the graph (a prefix hit makes 8 of them)
    assert len(outside) == 8 and runner.step_paths["decode_graph"] >= 14


def test_aborting_a_request_releases_its_row(llama_dir):
    llm = make(llama_dir, graphs=True)
    engine = llm.engine
    ids = [engine.add_request(p, greedy(12, frequency_penalty=1.0)) for p in PROMPTS[:3]]
    for _ in range(3):
        engine.step()
    table = engine.core.runner.sampling.penalty_table
    assert table is not None and len(table.slot_of) == 3
    engine.abort_request(ids[1])
    assert len(table.slot_of) == 2
    while engine.has_unfinished_requests():
        engine.step()
    assert not table.slot_of


def test_bf16_logits_are_penalized_in_float32(llama_dir):
    """In bfloat16 the model's logits are penalized after a float32 copy: the same choices as float32 logits
    rounded to bf16 and penalized in float32 (vLLM's sampler works in float32)."""
    llm = LLM(llama_dir, device="cpu", dtype="bfloat16", block_size=4, cpu_kv_tokens=2048)
    sp = greedy(10, repetition_penalty=1.7, frequency_penalty=0.3)
    outs = llm.generate(PROMPTS[:3], sp, use_tqdm=False)
    for prompt, out in zip(PROMPTS[:3], outs):
        tokens = out.outputs[0].token_ids
        logits = engine_prefill_logits(llm, prompt + tokens[:-1])[len(prompt) - 1 :]
        assert logits.dtype == torch.bfloat16
        for i, row in enumerate(logits.float().tolist()):
            want = penalize(row, prompt, tokens[:i], sp)
            assert max(want) - want[tokens[i]] < 0.1, (i, tokens)  # a bf16 forward: batched rounding differs
