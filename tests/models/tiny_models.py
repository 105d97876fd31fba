"""Tiny HF configs of every supported architecture, and HF models with random weights saved to disk."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

_LLAMA_BASE = {
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 112,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

TINY_CONFIGS: dict[str, dict] = {
    "llama": {
        **_LLAMA_BASE,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "mistral": {
        **_LLAMA_BASE,
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "num_key_value_heads": 1,
        "sliding_window": None,
    },
    "qwen2": {
        **_LLAMA_BASE,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "tie_word_embeddings": True,
        "use_sliding_window": False,
    },
    "qwen3": {
        **_LLAMA_BASE,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "head_dim": 32,
        "tie_word_embeddings": True,
        "attention_bias": False,
    },
    "gpt2": {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": 384,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 512,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "bos_token_id": 2,
        "eos_token_id": 2,
    },
}


def make_hf_model(arch: str, seed: int = 0, **overrides):
    """An HF model of the tiny config with every weight random (norms near 1, biases non-zero)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {**copy.deepcopy(TINY_CONFIGS[arch]), **overrides}
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, torch_dtype=torch.float32)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or ".ln_" in name or name.startswith(("ln_", "transformer.ln_f")):
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def save_hf_model(arch: str, directory: Path, seed: int = 0, **overrides):
    model = make_hf_model(arch, seed, **overrides)
    model.save_pretrained(directory, safe_serialization=True)
    return model
