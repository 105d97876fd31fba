"""Reference attention backend: plain torch, correct on CPU and GPU; the oracle for faster backends."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from roseinfer.attention.backend import AttentionBackend, register_backend
from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.kernels.decode_new_token import DeferredNorm
from roseinfer.kv.cache_dtype import to_cache_dtype
from roseinfer.profiling import record


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter new K/V rows into their cache slots, skipping padding rows (slot -1)."""
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        k, v, slot_mapping = k[valid], v[valid], slot_mapping[valid]
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    k_cache[blocks, offsets] = to_cache_dtype(k, k_cache.dtype)
    v_cache[blocks, offsets] = to_cache_dtype(v, v_cache.dtype)


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's first `seq_len` cached rows, [seq_len, kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    return cache[block_table[:num_blocks].long()].flatten(0, 1)[:seq_len]


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        norm: DeferredNorm | None = None,
    ) -> torch.Tensor:
        if rope is not None:
            raise ValueError("the torch backend does not fuse rotary: rotate q/k before forward()")
        if norm is not None:
            raise ValueError("the torch backend does not take deferred norms: finish q/k/v before forward()")
        with record("kv_write"):
            write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.zeros_like(q)
        group = q.shape[1] // k_cache.shape[2]
        starts = meta.query_start_loc_cpu
        for i, seq_len in enumerate(meta.seq_lens_cpu):
            lo, hi = starts[i], starts[i + 1]
            if hi == lo:
                continue
            keys = gather_context(k_cache, meta.block_tables[i], seq_len)
            values = gather_context(v_cache, meta.block_tables[i], seq_len)
            out[lo:hi] = attend(q[lo:hi], keys, values, scale, group)
        return out


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, group: int) -> torch.Tensor:
    """Causal attention of the last q_len positions of a context over all of it; q [q_len, H, D]."""
    q_len, ctx_len = q.shape[0], k.shape[0]
    k = k.repeat_interleave(group, dim=1) if group > 1 else k
    v = v.repeat_interleave(group, dim=1) if group > 1 else v
    q_pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device).unsqueeze(1)
    mask = torch.arange(ctx_len, device=q.device).unsqueeze(0) <= q_pos  # bottom-right aligned causal
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.to(q.dtype).transpose(0, 1),
        v.to(q.dtype).transpose(0, 1),
        attn_mask=mask,
        scale=scale,
    )
    return out.transpose(0, 1)


register_backend("torch", TorchAttentionBackend)
