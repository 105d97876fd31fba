"""Config fields that change the math: honoured as HF transformers honours them, or the request is refused.
Each test failed before its fix (the model loaded and ran with other math)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from roseinfer import LLM, SamplingParams
from tests.models.test_hf_parity import engine_prefill_logits
from tests.models.tiny_models import make_hf_model

PROMPT = list(range(3, 40))


def saved(arch: str, directory: Path, **overrides):
    model = make_hf_model(arch, **overrides)
    model.save_pretrained(directory)
    return model


def load(directory: Path, **kw) -> LLM:
    return LLM(str(directory), device="cpu", dtype="float32", cpu_kv_tokens=1024, **kw)


def relative_error(llm: LLM, model, prompt: list[int]) -> float:
    ours = engine_prefill_logits(llm, prompt)
    with torch.no_grad():
        ref = model(torch.tensor([prompt])).logits[0]
    return ((ours - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize(
    "arch, overrides",
    [
        ("mistral", {"sliding_window": 16}),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}),
    ],
)
def test_a_sliding_window_caps_the_context_where_full_attention_is_exact(tmp_path, arch, overrides):
    model = saved(arch, tmp_path, **overrides)
    llm = load(tmp_path)
    assert llm.engine.config.max_model_len == 16
    prompt, n = [5, 9, 77, 100, 7], 11  # 16 tokens: inside the window, the two attentions agree
    want = model.generate(
        torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(prompt) :].tolist()
    greedy = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    assert llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids == want
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([PROMPT], greedy, use_tqdm=False)
    with pytest.raises(ValueError, match="sliding_window"):
        load(tmp_path, max_model_len=32)


def test_gpt2_with_an_untied_lm_head_uses_it(tmp_path):
    model = saved("gpt2", tmp_path, tie_word_embeddings=False)
    assert not torch.equal(model.lm_head.weight, model.transformer.wte.weight)
    assert relative_error(load(tmp_path), model, PROMPT) < 1e-4


@pytest.mark.parametrize(
    "overrides", [{"scale_attn_by_inverse_layer_idx": True}, {"scale_attn_weights": False}]
)
def test_gpt2_attention_scale_options(tmp_path, overrides):
    model = saved("gpt2", tmp_path, **overrides)
    assert relative_error(load(tmp_path), model, PROMPT) < 1e-4


@pytest.mark.parametrize(
    "torch_dtype, device, want",
    [
        ("float32", "cuda", torch.bfloat16),  # as vLLM: a float32 checkpoint serves in bf16 on the GPU
        (None, "cuda", torch.bfloat16),
        ("float16", "cuda", torch.float16),
        ("bfloat16", "cuda", torch.bfloat16),
        ("bfloat16", "cpu", torch.float32),
    ],
)
def test_dtype_auto_follows_the_checkpoint_and_the_device(tmp_path, torch_dtype, device, want):
    import json

    from roseinfer.entrypoints.llm import make_engine_config

    saved("llama", tmp_path)
    config_file = tmp_path / "config.json"
    cfg = json.loads(config_file.read_text())
    cfg.pop("dtype", None)
    cfg["torch_dtype"] = torch_dtype
    config_file.write_text(json.dumps(cfg))
    config, _ = make_engine_config(str(tmp_path), device=device)
    assert config.dtype == want
