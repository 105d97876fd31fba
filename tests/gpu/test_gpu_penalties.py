"""Presence, frequency and repetition penalties on the GPU: the Triton backend with decode and mixed-step graphs
(penalty steps sample outside the graph, from the logits it returns: the fused lm_head + sampler's where the
model has a decode chain) against the same backend run eagerly, and greedy tokens against the whole-sequence
reference of `tests/engine/test_penalties.py`, in float32."""

from __future__ import annotations

import pytest

from roseinfer import SamplingParams
from tests.engine.test_penalties import check_greedy
from tests.gpu.conftest import fp32_triton_engine, free_gpu, graphs_then_eager, run
from tests.models.test_hf_parity import random_prompts

pytestmark = pytest.mark.gpu


def params_for(n_prompts: int) -> list[SamplingParams]:
    """Greedy rows with each penalty, seeded rows with penalties (one n = 2), and rows without any."""
    kinds = [
        dict(temperature=0.0, presence_penalty=1.5),
        dict(temperature=0.0, frequency_penalty=0.8),
        dict(temperature=0.0, repetition_penalty=1.6),
        dict(temperature=0.0, presence_penalty=-0.5, frequency_penalty=1.2, repetition_penalty=0.7),
        dict(temperature=0.8, seed=5, repetition_penalty=1.4, frequency_penalty=0.5),
        dict(temperature=1.0, seed=9, n=2, presence_penalty=1.0, top_k=40),
        dict(temperature=0.0),
        dict(temperature=1.0, seed=3),
    ]
    return [SamplingParams(max_tokens=16, ignore_eos=True, **kinds[i % len(kinds)]) for i in range(n_prompts)]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_penalties_on_graphs_match_eager_on_gpu(model_dir, async_scheduling):
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=61, lengths=[3, 17, 30, 5, 9, 64, 12, 40] * 2)
    params = params_for(len(prompts))
    common = dict(
        num_kv_blocks=256, max_num_seqs=16, max_num_batched_tokens=64, async_scheduling=async_scheduling
    )

    def after(fast) -> None:
        assert fast.engine.core.runner.step_paths["mixed_graph"] > 0
        assert not fast.engine.core.runner.sampling.penalty_table.slot_of

    got, ref, _ = graphs_then_eager(directory, prompts, params, after, **common)
    decided = 0
    for prompt, sp, samples in zip(prompts, params, got):
        if sp.greedy:
            decided += check_greedy(ref, prompt, samples[0], sp)
    assert decided > 0  # the penalties changed greedy choices


def test_penalties_survive_preemption_and_prefix_hits_on_gpu(model_dir):
    """A pool of 12 blocks of 16 tokens (recompute preemption) and prompts sharing a prefix (cache hits): the
    graphs' tokens equal those of an eager run with a big pool and the prefix cache off."""
    model, directory = model_dir
    vocab = model.config.vocab_size
    shared = random_prompts(vocab, seed=67, lengths=[40])[0]
    prompts = [shared + tail for tail in random_prompts(vocab, seed=71, lengths=[3, 9, 20, 1, 14, 6, 30, 2])]
    params = params_for(len(prompts))
    tight = fp32_triton_engine(directory, False, num_kv_blocks=12, max_num_seqs=8)
    got = run(tight, prompts, params)
    again = tight.generate(prompts, params, use_tqdm=False)
    assert tight.engine.core.scheduler.num_preemptions > 0
    assert any(o.num_cached_tokens > 0 for o in again)
    assert [[c.token_ids for c in o.outputs] for o in again] == got
    del tight, again
    free_gpu()
    ref = fp32_triton_engine(directory, True, num_kv_blocks=256, max_num_seqs=8, enable_prefix_caching=False)
    assert run(ref, prompts, params) == got
