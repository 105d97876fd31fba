"""Greedy output token-identical to HF transformers, prefill logits within 1e-4, every architecture."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roseinfer import LLM, SamplingParams
from roseinfer.models.layers import ForwardContext
from roseinfer.request import Request
from roseinfer.scheduler.scheduler import ScheduledRequest, SchedulerOutput

PROMPT_LENGTHS = [1, 7, 16, 17, 33, 63, 64, 65, 100]
MAX_TOKENS = 10


def random_prompts(vocab: int, seed: int, lengths=PROMPT_LENGTHS) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=n).tolist() for n in lengths]


def hf_greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def hf_regret(model, prompt: list[int], tokens: list[int]) -> float:
    """How far `tokens`, generated greedily after `prompt` by some other path, fall below HF's own choices: the
    sum over them of HF's top logit minus the chosen token's (near-ties cost little, a wrong token much)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(tokens)].float()
    chosen = logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]
    return float((logits.max(dim=1).values - chosen).sum())


def engine_prefill_logits(llm: LLM, prompt: list[int]) -> torch.Tensor:
    """Logits at every prompt position, computed by the engine's runner through the paged cache."""
    core = llm.engine.core
    req = Request("logits-probe", prompt, SamplingParams(max_tokens=1))
    assert core.kv.allocate_slots(req, len(prompt))
    try:
        out = SchedulerOutput([ScheduledRequest(req, len(prompt), num_samples=0)])
        ids, pos, meta = core.runner.prepare_inputs(out)
        with torch.inference_mode():
            ctx = ForwardContext(core.runner.kv_cache, meta, core.runner.backend)
            hidden = core.runner.model(ids, pos, ctx)
            return core.runner.model.compute_logits(hidden)
    finally:
        core.kv.free(req)


def greedy_params() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_greedy_matches_hf(hf_model, block_size):
    arch, model, directory = hf_model
    vocab = model.config.vocab_size
    prompts = random_prompts(vocab, seed=block_size)
    expected = [hf_greedy(model, p, MAX_TOKENS) for p in prompts]
    llm = LLM(directory, device="cpu", dtype="float32", block_size=block_size, cpu_kv_tokens=4096)
    outs = llm.generate(prompts, greedy_params(), use_tqdm=False)
    for prompt, out, want in zip(prompts, outs, expected):
        assert out.outputs[0].token_ids == want, f"{arch} bs={block_size} prompt len {len(prompt)}"
        assert out.outputs[0].finish_reason == "length"
    llm.engine.core.scheduler.check_invariants()
    assert llm.engine.core.kv.num_free_blocks == llm.engine.core.kv.num_blocks


def test_prefill_logits_match_hf(hf_model):
    arch, model, directory = hf_model
    llm = LLM(directory, device="cpu", dtype="float32", block_size=16, cpu_kv_tokens=1024)
    for prompt in random_prompts(model.config.vocab_size, seed=7, lengths=[5, 16, 47]):
        ours = engine_prefill_logits(llm, prompt)
        with torch.no_grad():
            ref = model(torch.tensor([prompt])).logits[0]
        rel = ((ours - ref).norm() / ref.norm()).item()
        assert rel < 1e-4, f"{arch}: prefill logits relative error {rel:.2e}"


def test_output_independent_of_batching_chunking_and_preemption(hf_model):
    arch, model, directory = hf_model
    prompts = random_prompts(model.config.vocab_size, seed=3, lengths=[30, 9, 41, 17, 2, 25])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    common = dict(device="cpu", dtype="float32", block_size=4)

    batched = LLM(directory, cpu_kv_tokens=2048, **common).generate(prompts, params, use_tqdm=False)
    want = [o.outputs[0].token_ids for o in batched]

    alone = LLM(directory, cpu_kv_tokens=2048, **common)
    for p, w in zip(prompts, want):
        assert alone.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids == w

    chunked = LLM(directory, cpu_kv_tokens=2048, max_num_batched_tokens=8, **common)
    assert [o.outputs[0].token_ids for o in chunked.generate(prompts, params, use_tqdm=False)] == want

    # A pool of 24 blocks x 4 tokens cannot hold all six sequences at once: the newest get preempted.
    tight = LLM(directory, num_kv_blocks=24, **common)
    outs = tight.generate(prompts, params, use_tqdm=False)
    assert tight.engine.core.scheduler.num_preemptions > 0, "the scenario must force preemption"
    assert [o.outputs[0].token_ids for o in outs] == want
    assert tight.engine.core.kv.num_free_blocks == 24
