"""Attention through the Triton kernels: store the step's K/V, then paged decode or paged prefill attention.

Decode-only steps (every sequence has one new token, row i <-> sequence i) take the split-K decode kernel;
anything else (prefill chunks, or decodes mixed with prefills) takes the prefill kernel, which handles
one-token chunks too. For decode the whole path is CUDA-graph safe: no host syncs, and every allocation
and launch shape depends only on tensor shapes and `meta.max_seq_len` (a host int).
"""

from __future__ import annotations

import torch

from roseinfer.attention.backend import AttentionBackend, register_backend
from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.kernels.block_copy import copy_blocks
from roseinfer.kernels.kv_store import store_kv
from roseinfer.kernels.paged_decode_attention import choose_num_splits, paged_decode_attention
from roseinfer.kernels.paged_prefill_attention import paged_prefill_attention
from roseinfer.profiling import record


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        with record("kv_write"):
            store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        num_tokens = q.shape[0]
        num_seqs = meta.seq_lens.shape[0]
        if meta.is_decode_only:
            out = torch.empty_like(q)
            batch = min(num_tokens, num_seqs)
            num_splits = choose_num_splits(batch, k_cache.shape[2], meta.max_seq_len, q.device)
            paged_decode_attention(
                q[:batch],
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                scale,
                out=out[:batch],
                num_splits=num_splits,
            )
            if batch < num_tokens:
                out[batch:].zero_()  # rows without a sequence (padding)
            return out
        # Rows past the last sequence's tokens (padding) are not written by the kernel: zero them.
        out = torch.empty_like(q)
        covered = meta.query_start_loc_cpu[-1] if meta.query_start_loc_cpu else 0
        if covered < num_tokens:
            out[covered:].zero_()
        return paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            meta.max_query_len,
            scale,
            out=out,
        )


    def copy_blocks(self, kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        copy_blocks(kv_cache, src, dst)


register_backend("triton", TritonAttentionBackend)
