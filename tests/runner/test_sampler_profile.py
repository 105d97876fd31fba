"""The sampler's worst case for start-up sizing (`runner/sampler_profile.py`, `ModelRunner.run_worst_case_step`):
the inputs it builds turn every sampling feature on and are what the real `sample` takes, the table goes
through its largest growth, and the runner is left as it was (on CPU, where sizing itself never profiles)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roseinfer import LLM, SamplingParams
from roseinfer.runner.model_runner import draw
from roseinfer.runner.penalties import PenaltyTable
from roseinfer.runner.prompt_logprobs import SLICE_ROWS
from roseinfer.runner.sampler_profile import ALLOWED, BAD_ID, BIASED_ID, STOP_ID, WorstCaseSampling

CPU = torch.device("cpu")
VOCAB = 64


def test_worst_case_inputs_turn_every_feature_on_and_sample_takes_them(monkeypatch):
    grown: list[tuple[int, int]] = []
    real_grow = PenaltyTable._grow

    def grow(self: PenaltyTable, capacity: int) -> None:
        old = len(self.counts)
        real_grow(self, capacity)
        grown.append((old, len(self.counts)))

    monkeypatch.setattr(PenaltyTable, "_grow", grow)
    rows, k = 20, 5
    worst = WorstCaseSampling.build(rows, VOCAB, CPU, k, prompt_rows=SLICE_ROWS + 7)
    assert grown[-1] == (rows - 1, rows)  # the old table and the full one, both alive while copying
    b = worst.batch
    assert b.top_k is not None and b.top_p is not None and b.min_p is not None and b.temperature is not None
    assert b.any_seeded and b.any_greedy and not b.all_greedy
    assert b.any_penalties and b.any_logit_controls and b.any_bad_words and b.any_min_tokens
    assert b.num_logprobs == k and worst.prompt_job.k == k
    assert len(worst.prompt_job.rows) == SLICE_ROWS  # one slice
    pen = worst.penalties
    assert pen is not None and pen.rows.tolist() == list(range(rows))
    assert len(pen.table.counts) == rows and len(pen.table.slot_of) == rows
    assert worst.controls is not None and worst.controls.rows is not None
    assert worst.controls.rows.allowed is not None and tuple(worst.controls.rows.allowed.shape) == (
        rows,
        VOCAB,
    )
    assert worst.banned is not None

    logits = torch.from_numpy(np.random.default_rng(0).normal(0.0, 3.0, (rows, VOCAB)).astype(np.float32))
    tokens, packed = draw(logits.clone(), b, worst.banned, pen, worst.controls)
    assert tokens.shape == (rows,) and packed is not None and tuple(packed.shape) == (rows, 2 * k + 3)
    # Only the allowed ids that are neither the stop id (under min_tokens) nor the bad word can be drawn.
    drawable = set(ALLOWED) - {STOP_ID, BAD_ID}
    assert set(tokens.tolist()) <= drawable
    # The greedy row: the biased id (in its prompt: divided by the repetition penalty where positive) or the
    # other one, in plain Python.
    lb = float(logits[0, BIASED_ID]) + 1.0
    lb = lb / 1.2 if lb > 0 else lb * 1.2
    (other,) = drawable - {BIASED_ID}
    assert int(tokens[0]) == (BIASED_ID if lb > float(logits[0, other]) else other)
    # The draw counted each row's token in its table row.
    counts = pen.table.counts[pen.slots]
    assert counts.sum(dim=1).tolist() == [1] * rows
    assert counts.argmax(dim=1).tolist() == tokens.tolist()


def test_a_tiny_vocabulary_is_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        WorstCaseSampling.build(4, len(ALLOWED), CPU, 0, prompt_rows=4)


def engine(model_dir: str, **kw) -> LLM:
    return LLM(model_dir, device="cpu", dtype="float32", block_size=4, cpu_kv_tokens=2048, **kw)


def test_the_worst_case_step_runs_on_the_real_paths_and_leaves_nothing_behind(llama_dir):
    """More sampled rows than the step's tokens (max_num_seqs 40, a budget of 16): the draw covers max_num_seqs
    rows. Afterwards the runner holds no table, generator or cached batch, its KV cache is the one it had, and
    its first steps draw what an engine that never ran it draws (unseeded rows share the runner's generator)."""
    kw = dict(max_num_seqs=40, max_num_batched_tokens=16, seed=7)
    probed, fresh = engine(llama_dir, **kw), engine(llama_dir, **kw)
    runner = probed.engine.core.runner
    cache = runner.kv_cache
    tokens = runner.run_worst_case_step()
    assert tokens.shape == (40,) and set(tokens.tolist()) <= set(ALLOWED) - {STOP_ID, BAD_ID}
    assert runner.kv_cache is cache
    state = runner.sampling
    assert state.penalty_table is None and not state.generators and state._cache is None
    prompts = [[11 + i for i in range(n)] for n in (3, 9, 17)]
    params = SamplingParams(
        temperature=1.0, top_p=0.9, max_tokens=8, ignore_eos=True, presence_penalty=0.7, logprobs=2
    )
    got = [o.outputs[0].token_ids for o in probed.generate(prompts, params, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in fresh.generate(prompts, params, use_tqdm=False)]
    assert got == want
