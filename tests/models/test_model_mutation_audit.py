"""Mutation audit (models/llama.py, gpt2.py, layers.py, registry.py): config fields whose tiny-config value
hid a mistake (norm epsilons at their defaults, GELU flavours), and checkpoint tensors that real exporters
write beside the weights (rotary inv_freq, GPT-2's attention-mask buffers, an lm_head saved although tied).
Each test compares with HF transformers running the same random weights in float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from roseinfer.config import ModelConfig
from roseinfer.models.registry import model_class
from tests.models.test_config_fields import PROMPT, load, relative_error, saved


@pytest.mark.parametrize(
    "arch, overrides",
    [
        # Hidden rows have a mean square near 0.04: an epsilon of 0.5 dominates every norm, so an epsilon
        # left at a default (or dropped) moves the logits far past the tolerance.
        ("llama", {"rms_norm_eps": 0.5}),
        ("qwen3", {"rms_norm_eps": 0.5}),  # the q/k norms take it too
        ("gpt2", {"layer_norm_epsilon": 0.5}),
    ],
)
def test_norm_epsilons_come_from_the_config(tmp_path, arch, overrides):
    model = saved(arch, tmp_path, **overrides)
    assert relative_error(load(tmp_path), model, PROMPT) < 1e-4


@pytest.mark.parametrize("activation", ["gelu", "gelu_new", "gelu_pytorch_tanh"])
def test_gpt2_activation_flavours_match_hf(tmp_path, activation):
    """HF's "gelu" is the exact (erf) GELU, "gelu_new" and "gelu_pytorch_tanh" the tanh approximation."""
    model = saved("gpt2", tmp_path, activation_function=activation)
    assert relative_error(load(tmp_path), model, PROMPT) < 1e-5


def _add_tensors(directory: Path, extra: dict[str, torch.Tensor]) -> None:
    file = directory / "model.safetensors"
    tensors = load_file(file)
    assert not set(extra) & set(tensors), "the checkpoint already holds these: the test would test nothing"
    tensors.update(extra)
    save_file(tensors, file, metadata={"format": "pt"})


def test_llama_checkpoint_with_rotary_inv_freq_buffers_loads(tmp_path):
    """Older Llama exports save each layer's `rotary_emb.inv_freq`; the model computes its own and skips them
    (garbage values here show they are not read)."""
    model = saved("llama", tmp_path)
    layers = model.config.num_hidden_layers
    _add_tensors(
        tmp_path,
        {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.full((8,), 123.0) for i in range(layers)},
    )
    assert relative_error(load(tmp_path), model, PROMPT) < 1e-4


@pytest.mark.parametrize(
    "arch, embed", [("qwen2", "model.embed_tokens.weight"), ("gpt2", "transformer.wte.weight")]
)
def test_tied_checkpoint_that_also_saves_lm_head_loads(tmp_path, arch, embed):
    """Some exporters write `lm_head.weight` although the config ties it to the embedding: HF ties it (the
    embedding wins), and so must we."""
    model = saved(arch, tmp_path)
    assert model.config.tie_word_embeddings
    _add_tensors(tmp_path, {"lm_head.weight": load_file(tmp_path / "model.safetensors")[embed].clone()})
    assert relative_error(load(tmp_path), model, PROMPT) < 1e-4


def test_gpt2_checkpoint_with_attention_mask_buffers_loads(tmp_path):
    """The original GPT-2 checkpoints carry `attn.bias` (the causal mask) and `attn.masked_bias` per layer."""
    model = saved("gpt2", tmp_path)
    n, layers = model.config.n_positions, model.config.n_layer
    extra: dict[str, torch.Tensor] = {}
    for i in range(layers):
        extra[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
        extra[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    _add_tensors(tmp_path, extra)
    assert relative_error(load(tmp_path), model, PROMPT) < 1e-4


@pytest.mark.parametrize(
    "arch, overrides, field",
    [
        ("gpt2", {"activation_function": "relu"}, "activation"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_an_activation_we_do_not_implement_is_refused_by_name(tmp_path, arch, overrides, field):
    saved(arch, tmp_path, **overrides)
    with pytest.raises(ValueError, match=field):
        load(tmp_path)


def test_model_class_refuses_an_unknown_architecture_by_name():
    from tests.models.tiny_models import TINY_CONFIGS

    cfg = ModelConfig.from_dict(TINY_CONFIGS["llama"])
    assert model_class(cfg).__name__ == "LlamaForCausalLM"
    unknown = ModelConfig(**{**cfg.__dict__, "architecture": "FalconForCausalLM"})
    with pytest.raises(ValueError, match="FalconForCausalLM"):
        model_class(unknown)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rmsnorm_rounds_where_hf_rounds(dtype):
    """In half precision the norm is computed in float32, rounded to the input dtype, then scaled by the
    weight, as HF's LlamaRMSNorm does; the residual add happens in the input dtype first. Bit for bit."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from roseinfer.models.layers import RMSNorm

    g = torch.Generator().manual_seed(3)
    x = torch.randn((7, 64), generator=g).to(dtype)
    residual = torch.randn((7, 64), generator=g).to(dtype)
    hf = LlamaRMSNorm(64, eps=1e-6).to(dtype)
    ours = RMSNorm(64, 1e-6).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(1 + 0.5 * torch.randn(64, generator=g))
        ours.weight.copy_(hf.weight)
        assert torch.equal(ours(x), hf(x))
        normed, summed = ours(x, residual)
        assert torch.equal(summed, x + residual)
        assert torch.equal(normed, hf(x + residual))


def test_llama3_rope_at_the_edge_of_the_low_frequency_band_matches_hf(tmp_path):
    """A wavelength exactly at `original_max_position_embeddings / low_freq_factor` is not yet low-frequency:
    HF smooths it (with a smooth factor of 0, so it is divided by `factor` once, not twice)."""
    import math

    head_dim, theta, old_len = 16, 500000.0, 64
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    wavelen = 2 * math.pi / inv_freq
    low = old_len / float(wavelen[1])  # the second frequency sits exactly on the edge
    assert float(torch.tensor(old_len / low)) == float(wavelen[1])
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": low,
        "high_freq_factor": 3.0,
        "original_max_position_embeddings": old_len,
    }
    model = saved("llama", tmp_path, rope_theta=theta, rope_scaling=scaling)
    assert relative_error(load(tmp_path), model, PROMPT) < 1e-4


def test_a_transposed_checkpoint_tensor_is_refused_by_name(tmp_path):
    """Same number of elements, other shape ([in, out] saved for [out, in]): refused naming the tensor, not
    copied through or failed inside torch's copy."""
    saved("llama", tmp_path)
    file = tmp_path / "model.safetensors"
    tensors = load_file(file)
    name = "model.layers.0.mlp.down_proj.weight"
    assert tensors[name].shape[0] != tensors[name].shape[1]
    tensors[name] = tensors[name].t().contiguous()
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        load(tmp_path)


def test_gpt2_config_without_the_attention_scale_keys_takes_hf_defaults(tmp_path):
    """The original GPT-2 config.json predates `scale_attn_weights` and `scale_attn_by_inverse_layer_idx`:
    HF then scales by 1 / sqrt(head_dim) and not by layer."""
    import json

    model = saved("gpt2", tmp_path)
    config_file = tmp_path / "config.json"
    cfg = json.loads(config_file.read_text())
    assert cfg.pop("scale_attn_weights") is True and cfg.pop("scale_attn_by_inverse_layer_idx") is False
    config_file.write_text(json.dumps(cfg))
    assert relative_error(load(tmp_path), model, PROMPT) < 1e-4
