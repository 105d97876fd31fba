"""A config.json that leaves out num_key_value_heads, head_dim or max_position_embeddings gets what HF's config
class for its architecture takes (Mistral's 8 kv heads, Qwen3's head_dim of 128, each family's context), checked
against transformers' own classes built from the same dict; a key set to null falls back as llama's does."""

from __future__ import annotations

import pytest
import transformers

from roseinfer.config import ModelConfig

ARCHS = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]
TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
# 32 heads of 32 dims: every family's default kv head count (8 or 32) divides them.
BASE = dict(
    hidden_size=1024, num_attention_heads=32, intermediate_size=2048, num_hidden_layers=2, vocab_size=512
)


def hf(arch: str, cfg: dict) -> transformers.PretrainedConfig:
    keys = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}
    return transformers.AutoConfig.for_model(TYPES[arch], **keys)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("with_type", [True, False], ids=["model_type", "architectures-only"])
def test_missing_keys_take_hfs_defaults(arch, with_type):
    cfg = dict(BASE, architectures=[arch])
    if with_type:
        cfg["model_type"] = TYPES[arch]
    ours, theirs = ModelConfig.from_dict(cfg), hf(arch, cfg)
    assert ours.num_kv_heads == theirs.num_key_value_heads
    assert ours.head_dim == (
        getattr(theirs, "head_dim", None) or BASE["hidden_size"] // BASE["num_attention_heads"]
    )
    assert ours.max_position_embeddings == theirs.max_position_embeddings


@pytest.mark.parametrize("arch", ARCHS)
def test_keys_that_are_set_win(arch):
    cfg = dict(BASE, architectures=[arch], num_key_value_heads=4, head_dim=48, max_position_embeddings=777)
    ours, theirs = ModelConfig.from_dict(cfg), hf(arch, cfg)
    assert (ours.num_kv_heads, ours.head_dim, ours.max_position_embeddings) == (4, 48, 777)
    assert (theirs.num_key_value_heads, theirs.max_position_embeddings) == (4, 777)


@pytest.mark.parametrize("arch", ARCHS)
def test_null_keys_fall_back_to_the_heads(arch):
    cfg = dict(BASE, architectures=[arch], num_key_value_heads=None, head_dim=None)
    ours = ModelConfig.from_dict(cfg)
    assert (ours.num_kv_heads, ours.head_dim) == (32, 32)
