"""`prompt_logprobs` on the GPU as it serves: the Triton backend with decode and mixed-step CUDA graphs, chunked
prefill, a prefix cache holding the prompts, in float32 and bfloat16, against one whole-prompt forward of the
torch backend (eager) in float32."""

from __future__ import annotations

import pytest

from roseinfer import LLM, SamplingParams
from tests.engine.test_logprobs import check_position
from tests.engine.test_prompt_logprobs import reference
from tests.gpu.conftest import free_gpu
from tests.models.test_hf_parity import random_prompts

pytestmark = pytest.mark.gpu

LENGTHS = [1, 3, 17, 64, 100, 230]  # one token; within, at and past a step's budget of 64
KS = [2, 5, 0, 5, -1, 20]  # -1: the whole vocabulary


def engine(directory: str, dtype: str, backend: str, eager: bool) -> LLM:
    return LLM(
        directory,
        device="cuda",
        dtype=dtype,
        block_size=16,
        attention_backend=backend,
        enforce_eager=eager,
        num_kv_blocks=256,
        max_num_seqs=16,
        max_num_batched_tokens=64,
        max_logprobs=-1,
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prompt_logprobs_with_cuda_graphs_match_a_whole_prompt_forward(model_dir, dtype):
    """Each prompt's entries (the prompt token first, the top k ranked 1..k) within a dtype's reach of the
    float32 torch forward: 5e-3 in float32 (Triton's attention may round its dots as tf32), 0.5 each and 0.06
    on average in bf16 (what tests/gpu/test_gpu_e2e.py measured for sample logprobs). Plain requests share the
    steps, so decode and mixed-step graphs serve; the prompts were served once before, so a prefix-cache hit is
    there, and is not read. In float32 the greedy tokens equal those of a run without prompt_logprobs."""
    model, directory = model_dir
    vocab = model.config.vocab_size
    prompts = random_prompts(vocab, seed=71, lengths=LENGTHS)
    ref_engine = engine(directory, "float32", "torch", eager=True)
    refs = [reference(ref_engine, p) if len(p) > 1 else None for p in prompts]
    del ref_engine
    free_gpu()

    llm = engine(directory, dtype, "triton", eager=False)
    plain = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    first = llm.generate(prompts, plain, use_tqdm=False)  # fills the prefix cache
    asked = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=k) for k in KS]
    others = random_prompts(vocab, seed=72, lengths=[40, 90, 7])
    outs = llm.generate(prompts + others, asked + [plain] * len(others), use_tqdm=False)
    paths = llm.engine.core.runner.step_paths
    assert paths["decode_graph"] > 0 and paths["mixed_graph"] > 0 and paths["eager"] > 0, paths

    tol = 5e-3 if dtype == "float32" else 0.5
    errors = []
    for prompt, out, k, ref in zip(prompts, outs, KS, refs):
        got = out.prompt_logprobs
        assert got is not None and len(got) == len(prompt) and got[0] is None
        assert out.num_cached_tokens == 0
        want_k = vocab if k == -1 else k
        for i in range(1, len(prompt)):
            check_position(got[i], prompt[i], ref[i - 1], want_k, tol)
            errors += [abs(lp.logprob - float(ref[i - 1, t])) for t, lp in got[i].items()]
    assert all(o.prompt_logprobs is None for o in outs[len(prompts) :])
    mean = sum(errors) / len(errors)
    assert mean < (1e-3 if dtype == "float32" else 0.06), mean
    if dtype == "float32":
        assert [o.outputs[0].token_ids for o in outs[: len(prompts)]] == [
            o.outputs[0].token_ids for o in first
        ]
    del llm
    free_gpu()
