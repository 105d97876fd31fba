"""GPT-2: learned positions, LayerNorm, fused qkv with bias, tanh GELU, tied LM head."""

from __future__ import annotations

import torch
from torch import nn

from roseinfer.config import ModelConfig
from roseinfer.models.layers import ACTIVATIONS, ForwardContext, copy_checkpoint_tensor, paged_attention


class GPT2Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        hf = cfg.hf_config
        self.scale = self.head_dim**-0.5 if hf.get("scale_attn_weights", True) else 1.0
        if hf.get("scale_attn_by_inverse_layer_idx", False):
            self.scale /= float(layer_idx + 1)
        self.c_attn = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.c_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        q, k, v = self.c_attn(x).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        return self.c_proj(paged_attention(self.layer_idx, q, k, v, ctx, self.scale))


class GPT2MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.hidden_act not in ACTIVATIONS:
            raise ValueError(f"activation {cfg.hidden_act!r} is not supported for GPT-2")
        self.c_fc = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.c_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = GPT2Attention(cfg, layer_idx)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), ctx)
        return x + self.mlp(self.ln_2(x))


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.h = nn.ModuleList(GPT2Block(cfg, i) for i in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.h:
            x = block(x, ctx)
        return self.ln_f(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.cfg.tie_word_embeddings:
            return self.lm_head(hidden)
        return hidden @ self.wte.weight.t()

    def build_buffers(self, device: torch.device) -> None:
        pass

    def tie_weights(self) -> None:
        pass  # compute_logits reads wte directly

    def load_weight(self, params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor) -> str | None:
        name = name.removeprefix("transformer.")
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            return None
        if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
            return None
        # HF GPT-2 stores its projections as Conv1D, [in, out]: ours are nn.Linear, [out, in].
        if name.endswith(".weight") and any(p in name for p in ("c_attn", "c_proj", "c_fc")):
            tensor = tensor.t()
        copy_checkpoint_tensor(params[name].data, tensor, name)
        return name

    def expected_weights(self, params: dict[str, nn.Parameter]) -> set[str]:
        return set(params)
