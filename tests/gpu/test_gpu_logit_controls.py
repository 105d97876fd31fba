"""allowed_token_ids, logit_bias and bad_words on the GPU: the Triton backend with decode and mixed-step graphs
(their steps sample outside the graph, from the logits it returns) against the same backend run eagerly, and
greedy tokens against the whole-sequence reference of `tests/engine/logit_reference.py`, in float32."""

from __future__ import annotations

import pytest

from roseinfer import SamplingParams
from tests.engine.logit_reference import check_greedy
from tests.engine.test_bad_words import PROMPTS as WORD_PROMPTS
from tests.engine.test_bad_words import word_ids, words_from
from tests.gpu.conftest import free_gpu, graphs_then_eager
from tests.models.test_hf_parity import random_prompts

pytestmark = pytest.mark.gpu


def params_for(n_prompts: int, vocab: int) -> list[SamplingParams]:
    allowed = [3, 50, 101, vocab - 1, vocab // 2]
    kinds = [
        dict(temperature=0.0, allowed_token_ids=allowed),
        dict(temperature=0.0, logit_bias={5: 6.0, 9: 4.0, 300 % vocab: 2.5}),
        dict(
            temperature=0.0, allowed_token_ids=allowed, logit_bias={3: -3.0, 50: 5.0}, repetition_penalty=1.5
        ),
        dict(temperature=0.8, seed=5, allowed_token_ids=allowed, logit_bias={101: 1.0}),
        dict(temperature=1.0, seed=9, n=2, logit_bias={7: 8.0}, top_k=40),
        dict(temperature=0.0),
        dict(temperature=1.0, seed=3),
    ]
    return [SamplingParams(max_tokens=16, ignore_eos=True, **kinds[i % len(kinds)]) for i in range(n_prompts)]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_allowed_ids_and_bias_on_graphs_match_eager_on_gpu(model_dir, async_scheduling):
    model, directory = model_dir
    vocab = model.config.vocab_size
    prompts = random_prompts(vocab, seed=71, lengths=[3, 17, 30, 5, 9, 64, 12, 40] * 2)
    params = params_for(len(prompts), vocab)
    common = dict(
        num_kv_blocks=256, max_num_seqs=16, max_num_batched_tokens=64, async_scheduling=async_scheduling
    )

    def after(fast) -> None:
        assert fast.engine.core.runner.step_paths["mixed_graph"] > 0

    got, ref, _ = graphs_then_eager(directory, prompts, params, after, **common)
    decided = 0
    for prompt, sp, samples in zip(prompts, params, got):
        for ids in samples:
            if sp.allowed_token_ids:
                assert set(ids) <= set(sp.allowed_token_ids)
        if sp.greedy:
            decided += check_greedy(ref, prompt, samples[0], sp)
    assert decided > 0
    del ref
    free_gpu()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_bad_words_on_graphs_match_eager_on_gpu(model_with_tokenizer, async_scheduling):
    """Words from the model's own greedy output (several tokens long where found), greedy and seeded rows."""
    common = dict(
        num_kv_blocks=256, max_num_seqs=16, max_num_batched_tokens=64, async_scheduling=async_scheduling
    )

    def params_from(fast) -> list[SamplingParams]:
        free_text = fast.generate(
            WORD_PROMPTS, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), use_tqdm=False
        )
        params = []
        for i, out in enumerate(free_text):
            tokens = out.outputs[0].token_ids
            words = (words_from(fast, tokens, 2) + words_from(fast, tokens, 1))[:2] or ["the"]
            kind = dict(temperature=0.0) if i % 2 == 0 else dict(temperature=1.0, seed=i, n=2)
            params.append(SamplingParams(max_tokens=16, ignore_eos=True, bad_words=words, **kind))
        return params

    got, ref, params = graphs_then_eager(model_with_tokenizer, WORD_PROMPTS, params_from, **common)
    for prompt, sp, samples in zip(WORD_PROMPTS, params, got):
        if sp.greedy:
            check_greedy(ref, prompt, samples[0], sp, word_ids(ref, sp.bad_words))
    del ref
    free_gpu()
