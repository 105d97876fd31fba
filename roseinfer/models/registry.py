"""Architecture name -> model class."""

from __future__ import annotations

from torch import nn

from roseinfer.config import ModelConfig
from roseinfer.models.gpt2 import GPT2LMHeadModel
from roseinfer.models.llama import LlamaForCausalLM

MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    "GPT2LMHeadModel": GPT2LMHeadModel,
}


def model_class(cfg: ModelConfig) -> type[nn.Module]:
    if cfg.architecture not in MODEL_CLASSES:
        raise ValueError(
            f"architecture {cfg.architecture!r} is not supported; supported: {sorted(MODEL_CLASSES)}"
        )
    return MODEL_CLASSES[cfg.architecture]
