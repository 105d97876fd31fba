"""The one-token GEMV path of the llama-family models, end to end against HF transformers.

On a GPU, batches of one token take this path by themselves. Here, on the CPU, the test lets the model take
it (the GEMVs run under Triton's interpreter) while everything else stays torch, and checks greedy output
token for token against HF on the same random weights, one prompt at a time so that every decode step is a
batch of one.
"""

from __future__ import annotations

import pytest

import roseinfer.models.llama as llama
from roseinfer import LLM, SamplingParams
from tests.models.test_hf_parity import hf_greedy, random_prompts
from tests.models.tiny_models import save_hf_model

# An engine on the CPU with Triton GEMVs: where CUDA is, the interpreter is off and the GPU tests run this
# path compiled.
pytestmark = pytest.mark.interpreter


@pytest.fixture
def gemv_on_cpu(monkeypatch):
    calls = []
    real = llama.gemv

    def counting_gemv(*args, **kwargs):
        calls.append(args[1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(llama, "fused_kernels_for", lambda x: True)
    monkeypatch.setattr(llama, "gemv", counting_gemv)
    return calls


@pytest.mark.parametrize(
    "arch", ["llama", "qwen2", "qwen3"]
)  # llama3 rope; qkv bias + tied lm_head; q/k norm
def test_batch_of_one_gemv_path_matches_hf(arch, tmp_path, gemv_on_cpu):
    model = save_hf_model(arch, tmp_path)
    prompts = random_prompts(model.config.vocab_size, seed=21, lengths=[1, 17])
    llm = LLM(str(tmp_path), device="cpu", dtype="float32", block_size=16, cpu_kv_tokens=1024)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for prompt in prompts:
        want = hf_greedy(model, prompt, 4)
        assert llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids == want, len(prompt)
    layers = model.config.num_hidden_layers
    # Every decode step (3 per prompt) and the 1-token prompt's prefill: 4 GEMVs per layer and the lm_head;
    # the 17-token prefill computes its last position's logits (one row) with the lm_head GEMV as well.
    assert len(gemv_on_cpu) == (2 * 3 + 1) * (4 * layers + 1) + 1
    assert llm.engine.core.kv.num_free_blocks == llm.engine.core.kv.num_blocks


def test_gemv_path_switched_off(tmp_path, gemv_on_cpu):
    save_hf_model("llama", tmp_path)
    llm = LLM(
        str(tmp_path), device="cpu", dtype="float32", block_size=16, cpu_kv_tokens=1024, one_token_gemv=False
    )
    assert llm.engine.core.runner.model.one_token_gemv is False
    llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert gemv_on_cpu == []
