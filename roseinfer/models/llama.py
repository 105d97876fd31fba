"""Llama-family decoder: Llama 2/3/3.1, Mistral, Qwen2/2.5 (qkv bias), Qwen3 (q/k norm)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from roseinfer.config import ModelConfig
from roseinfer.kernels.decode_new_token import DeferredNorm
from roseinfer.kernels.logits_sample import MAX_FUSED_ROWS, logits_and_sample
from roseinfer.kernels.skinny_gemm import MAX_ROWS as SKINNY_MAX_ROWS
from roseinfer.models.layers import (
    ForwardContext,
    RMSNorm,
    RotaryEmbedding,
    add_project_,
    copy_checkpoint_tensor,
    down_blas_library,
    fused_kernels_for,
    gemv,
    normalize_qk,
    paged_attention,
    preferred_blas,
    project,
    silu_and_mul,
)

# Models up to this width run the whole decode chain (`decode_chain`).
PDL_DECODE_MAX_HIDDEN = 1024
# Wider models chain steps of up to this many rows, with decode attention in the chain at up to
# WIDE_CHAIN_ATTENTION_MAX_ROWS rows and outside it above.
WIDE_CHAIN_MAX_ROWS = 24
WIDE_CHAIN_ATTENTION_MAX_ROWS = 8


@dataclass(frozen=True)
class DecodeChain:
    """How decode-only steps on the deferred-norm path (folded norms) run where `pdl_decode` is on: steps of up
    to `max_rows` rows run their GEMMs as the skinny Triton GEMM in one programmatic-dependent-launch chain
    with SiLU, and with decode attention too at up to `attention_max_rows` rows (above that, attention
    launches once the qkv GEMM has finished, and the o GEMM once attention has)."""

    max_rows: int
    attention_max_rows: int

    def attention_joins(self, rows: int) -> bool:
        return rows <= self.attention_max_rows


def decode_chain(hidden_size: int) -> DecodeChain:
    """The chain for a model width, from H100 decode steps against torch's GEMMs (`scripts/ab_pdl_decode.py`,
    ctx 1k, PERFORMANCE.md twenty-sixth session):
    - qwen2.5-0.5b (896), the whole chain: -4 to -10% a step at 8-64 rows.
    - llama-3.1-8b (4096), the whole chain: -4.5%, -4.7%, -5.5% at 2, 4, 8 rows, -0.9% at 16, but +4.4% at 24
      and +5.4% at 32. With attention outside it: -3.0%, -2.9%, -3.6%, -3.4%, -1.1%, +1.0% at 2, 4, 8, 16, 24,
      32 (ctx 4k: attention in the chain still 0.4-1.2% faster at 4-8 rows; outside, 1.6% faster at 16). So wide
      models chain up to 24 rows, attention in the chain up to 8. (Decode graphs pad 17-24 rows to 32 unless
      `max_num_seqs` is at most 24: `graph_batch_sizes`.)"""
    if hidden_size <= PDL_DECODE_MAX_HIDDEN:
        return DecodeChain(SKINNY_MAX_ROWS, attention_max_rows=SKINNY_MAX_ROWS)
    return DecodeChain(WIDE_CHAIN_MAX_ROWS, attention_max_rows=WIDE_CHAIN_ATTENTION_MAX_ROWS)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.rotary = rotary
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return self.o_proj(self._attend(self.qkv_proj(x), positions, ctx))

    def forward_one_token(
        self, residual: torch.Tensor, norm: RMSNorm, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """`residual + o_proj(attention(qkv_proj(norm(residual))))` for one token, in GEMVs."""
        qkv = gemv(
            residual, self.qkv_proj.weight, bias=self.qkv_proj.bias, norm_weight=norm.weight, eps=norm.eps
        )
        return gemv(self._attend(qkv, positions, ctx), self.o_proj.weight, residual=residual)

    def attend_deferred_norm(
        self,
        x: torch.Tensor,
        norm: RMSNorm,
        positions: torch.Tensor,
        ctx: ForwardContext,
        chain: DecodeChain | None = None,
    ) -> torch.Tensor:
        """Attention of `norm(x)` with the norm's weight folded into qkv_proj (`fold_norm_weights`): the qkv
        GEMM reads x itself, and the attention kernel finishes q/k/v (1 / rms of x, bias) as it loads them.
        With a `chain`, the qkv GEMM (and attention, if the chain takes it at x's rows) joins it."""
        qkv = project(x, self.qkv_proj.weight, pdl=chain is not None)
        q, k, v = self._split_heads(qkv)
        attention_pdl = chain is not None and chain.attention_joins(x.shape[0])
        unfinished = DeferredNorm(x, norm.eps, self.qkv_proj.bias, attention_pdl)
        return paged_attention(self.layer_idx, q, k, v, ctx, self.scale, positions, self.rotary, unfinished)

    def _split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        return q, k, v.view(-1, self.num_kv_heads, self.head_dim)

    def _attend(self, qkv: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        q, k, v = self._split_heads(qkv)
        if self.q_norm is not None:
            q, k = normalize_qk(qkv, q, k, self.q_norm, self.k_norm)
        return paged_attention(self.layer_idx, q, k, v, ctx, self.scale, positions, self.rotary)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"hidden_act {cfg.hidden_act!r} is not supported for {cfg.architecture}")
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = silu_and_mul(self.gate_up_proj(x))
        with preferred_blas(self._down_library(act)):
            return self.down_proj(act)

    def add_down_(self, residual: torch.Tensor, act: torch.Tensor, pdl: bool = False) -> None:
        """`residual += act @ down.T` in place (one GEMM with beta = 1; `pdl`: see `add_project_`)."""
        if pdl:
            add_project_(residual, act, self.down_proj.weight, pdl=True)
            return
        with preferred_blas(self._down_library(act)):
            residual.addmm_(act, self.down_proj.weight.t())

    def _down_library(self, act: torch.Tensor) -> str | None:
        return down_blas_library(act.shape[0], act.shape[-1], act.is_cuda)

    def forward_one_token(self, residual: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """`residual + down(silu_and_mul(gate_up(norm(residual))))` for one token, in two GEMVs."""
        act = gemv(residual, self.gate_up_proj.weight, norm_weight=norm.weight, eps=norm.eps, gated=True)
        return gemv(act, self.down_proj.weight, residual=residual)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_idx, rotary)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, positions, ctx)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual

    def forward_one_token(
        self, residual: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """The layer for a batch of one token, carrying only the residual stream: the norms fold into the
        GEMVs that read them and the residual adds into the GEMVs that write them (five launches, not eight)."""
        residual = self.self_attn.forward_one_token(residual, self.input_layernorm, positions, ctx)
        return self.mlp.forward_one_token(residual, self.post_attention_layernorm)

    def forward_deferred_norm(
        self,
        residual: torch.Tensor,
        positions: torch.Tensor,
        ctx: ForwardContext,
        chain: DecodeChain | None = None,
    ) -> None:
        """The layer on the residual stream, in place, with no norm launch (norm weights folded into the
        linears): qkv GEMM, attention (finishing q/k/v), o GEMM adding into the stream, gate_up GEMM, SiLU
        (applying the second norm's 1 / rms), down GEMM adding into the stream: six launches (and any split-K
        reduce), not nine. With a `chain` the GEMMs are the skinny Triton GEMM and the launches join one
        programmatic-dependent-launch chain (`DecodeChain`), so each overlaps the tail of the one before."""
        pdl = chain is not None
        attn = self.self_attn.attend_deferred_norm(residual, self.input_layernorm, positions, ctx, chain)
        add_project_(residual, attn, self.self_attn.o_proj.weight, pdl)
        gate_up = project(residual, self.mlp.gate_up_proj.weight, pdl)
        act = silu_and_mul(gate_up, rms_of=residual, eps=self.post_attention_layernorm.eps, pdl=pdl)
        self.mlp.add_down_(residual, act, pdl)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i, self.rotary) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: ForwardContext,
        one_token_gemv: bool = False,
        deferred_norm: bool = False,
        chain: DecodeChain | None = None,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if one_token_gemv:
            for layer in self.layers:
                x = layer.forward_one_token(x, positions, ctx)
            return self.norm(x)
        if deferred_norm:
            for layer in self.layers:  # x is the residual stream, updated in place
                layer.forward_deferred_norm(x, positions, ctx, chain)
            return self.norm(x, pdl=chain is not None)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, ctx)
        x, _ = self.norm(x, residual)
        return x


class LlamaForCausalLM(nn.Module):
    # HF checkpoint name fragment -> (our fused parameter fragment, shard index)
    stacked_params = {
        ".q_proj.": (".qkv_proj.", 0),
        ".k_proj.": (".qkv_proj.", 1),
        ".v_proj.": (".qkv_proj.", 2),
        ".gate_proj.": (".gate_up_proj.", 0),
        ".up_proj.": (".gate_up_proj.", 1),
    }

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        # Batches of one token (batch-1 decode) run as GEMVs with the norms and residual adds folded in.
        self.one_token_gemv = True
        # Set by fold_norm_weights: decode-only steps then run without RMSNorm launches.
        self.norms_folded = False
        # Set by the runner where PDL pays (`pdl_decode_pays`, an sm_90+ GPU): decode-only steps then run as
        # this model width's programmatic-dependent-launch chain.
        self.pdl_decode = False
        self.decode_chain = decode_chain(cfg.hidden_size)
        self.model = LlamaModel(cfg, max_positions)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        if self._gemv_for(input_ids):
            return self.model(input_ids, positions, ctx, one_token_gemv=True)
        return self._forward_hidden(input_ids, positions, ctx)[0]

    def forward_sample(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: ForwardContext,
        temperature: torch.Tensor,
        seeds: torch.Tensor,
        tokens: torch.Tensor,
    ) -> torch.Tensor | None:
        """Every row's logits, each row's token drawn into `tokens` as `kernels/sampling.sample_tokens` draws it,
        by the lm_head with the sampler in its epilogue (`kernels/logits_sample.py`); where the step runs the
        decode chain, the final norm, the lm_head and the sampler join it. None, with nothing run, for a step
        the fused lm_head does not take (one row: the GEMV; more than `MAX_FUSED_ROWS`; no Triton on CUDA)."""
        rows = input_ids.shape[0]
        if self._gemv_for(input_ids) or rows > MAX_FUSED_ROWS or not fused_kernels_for(input_ids):
            return None
        hidden, chained = self._forward_hidden(input_ids, positions, ctx)
        return logits_and_sample(hidden, self.lm_head.weight, temperature, seeds, tokens, pdl=chained)

    def _forward_hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> tuple[torch.Tensor, bool]:
        """The final norm's output of a step of more than one row, and whether it ran the decode chain."""
        deferred = self._deferred_norm_for(input_ids, ctx)
        chain = self._chain_for(input_ids, deferred)
        hidden = self.model(input_ids, positions, ctx, deferred_norm=deferred, chain=chain)
        return hidden, chain is not None

    def _deferred_norm_for(self, input_ids: torch.Tensor, ctx: ForwardContext) -> bool:
        return (
            self.norms_folded
            and ctx.meta.is_decode_only
            and ctx.backend.deferred_norm_pays(input_ids.shape[0], self.cfg.head_dim)
            and fused_kernels_for(input_ids)
        )

    def _chain_for(self, input_ids: torch.Tensor, deferred: bool) -> DecodeChain | None:
        chained = deferred and self.pdl_decode and input_ids.shape[0] <= self.decode_chain.max_rows
        return self.decode_chain if chained else None

    @property
    def pdl_decode_pays(self) -> bool:
        """Whether decode steps should run as a PDL chain: only on the deferred-norm path (folded norms)."""
        return self.norms_folded

    @property
    def can_fold_norms(self) -> bool:
        """q/k norms (Qwen3) sit between qkv_proj and attention, where the deferred norm is applied."""
        return not self.cfg.qk_norm

    @torch.no_grad()
    def fold_norm_weights(self) -> None:
        """Fold each layer's RMSNorm weight g into the linear that reads the norm, `norm(x; g) @ W.T ==
        norm(x; 1) @ (W * g).T`, and leave the norms with unit weights: every path computes the same
        function, and decode-only steps may skip the norm launches (`LlamaDecoderLayer.forward_deferred_norm`).
        The final norm is left alone (the lm_head may be tied to the embedding)."""
        if not self.can_fold_norms:
            raise ValueError(f"{self.cfg.architecture}: q/k norms stop the norm weights from being folded")
        if self.norms_folded:
            return
        for layer in self.model.layers:
            pairs = (
                (layer.input_layernorm, layer.self_attn.qkv_proj),
                (layer.post_attention_layernorm, layer.mlp.gate_up_proj),
            )
            for norm, linear in pairs:
                w = linear.weight
                w.copy_((w.float() * norm.weight.float()[None, :]).to(w.dtype))
                norm.weight.fill_(1.0)
        self.norms_folded = True

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._gemv_for(hidden):
            return gemv(hidden, self.lm_head.weight)
        return self.lm_head(hidden)

    def _gemv_for(self, x: torch.Tensor) -> bool:
        return self.one_token_gemv and x.shape[0] == 1 and fused_kernels_for(x)

    def build_buffers(self, device: torch.device) -> None:
        self.model.rotary.build(device)

    def shard_sizes(self, fused: str) -> list[int]:
        cfg = self.cfg
        if fused == ".qkv_proj.":
            return [
                cfg.num_heads * cfg.head_dim,
                cfg.num_kv_heads * cfg.head_dim,
                cfg.num_kv_heads * cfg.head_dim,
            ]
        return [cfg.intermediate_size, cfg.intermediate_size]

    def load_weight(self, params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor) -> str | None:
        """Copy one checkpoint tensor into place; returns the parameter name it filled, or None if skipped."""
        if "rotary_emb.inv_freq" in name:
            return None
        if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
            return None
        for frag, (fused, shard) in self.stacked_params.items():
            if frag in name:
                target = name.replace(frag, fused)
                sizes = self.shard_sizes(fused)
                start = sum(sizes[:shard])
                copy_checkpoint_tensor(params[target].data[start : start + sizes[shard]], tensor, name)
                return f"{target}#{shard}"
        copy_checkpoint_tensor(params[name].data, tensor, name)
        return name

    def expected_weights(self, params: dict[str, nn.Parameter]) -> set[str]:
        names: set[str] = set()
        for name in params:
            fused = next((f for f in (".qkv_proj.", ".gate_up_proj.") if f in name), None)
            if fused is None:
                names.add(name)
            else:
                names.update(f"{name}#{i}" for i in range(len(self.shard_sizes(fused))))
        return names
