"""Attention through the Triton kernels.

A decode-only step (every sequence has one new token, row i <-> sequence i) is one launch per layer: the
split-K decode kernel rotates q and the new k in registers, attends to the new token from them and writes
its K/V to the cache; given a `DeferredNorm`, it first finishes q/k/v (the layer's RMSNorm, deferred).

Any other step first stores its K/V (rotating in the same launch), then runs the prefill kernel, except
for the decodes at its front, which take the decode kernel. The prefill kernel takes a tile map when the
step brings one (`meta.prefill_tiles`): inside a mixed-step graph always, in an eager step when short
chunks over long prefixes are worth cutting across programs by keys.

For decode the whole path is CUDA-graph safe: no host syncs, and every allocation and launch shape depends
only on tensor shapes and `meta.max_seq_len` (a host int).
"""

from __future__ import annotations

import torch

from roseinfer.attention.backend import AttentionBackend, register_backend
from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.kernels.block_copy import copy_blocks
from roseinfer.kernels.decode_new_token import DeferredNorm, NewTokenKV
from roseinfer.kernels.kv_store import store_kv
from roseinfer.kernels.paged_decode_attention import paged_decode_attention
from roseinfer.kernels.paged_decode_split import MAX_SPLITS, choose_num_splits
from roseinfer.kernels.paged_prefill_attention import paged_prefill_attention
from roseinfer.kernels.prefill_plan import LONG_TILE, SPLIT_PARTIAL_ROWS
from roseinfer.kernels.rotary import apply_rotary_and_store_kv
from roseinfer.profiling import record


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    fuses_rotary = True
    defers_norm = True
    takes_tile_maps = True

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        norm: DeferredNorm | None = None,
    ) -> torch.Tensor:
        num_tokens = q.shape[0]
        num_seqs = meta.seq_lens.shape[0]
        out = torch.empty_like(q)
        if meta.is_decode_only:
            # One launch: the kernel rotates q and the new k in registers, attends to the new token from
            # them, and writes its K/V to the cache slot.
            batch = min(num_tokens, num_seqs)
            new_kv = NewTokenKV(k[:batch], v[:batch], meta.slot_mapping[:batch], rope, norm)
            with record("kv_write+attention"):
                self._decode(q, k_cache, v_cache, meta, scale, out, batch, meta.max_seq_len, new_kv)
            if batch < num_tokens:
                out[batch:].zero_()  # rows without a sequence (padding)
            return out
        if norm is not None:
            raise ValueError("a deferred norm is only taken on decode-only steps")
        with record("kv_write"):
            if rope is None:
                store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            else:  # rotate q in place and k into its cache slot, in the launch that stores the KV
                apply_rotary_and_store_kv(q, k, v, *rope, k_cache, v_cache, meta.slot_mapping)
        if meta.decode_seq_lens is not None:  # inside a mixed-step graph
            self._fixed_shape_decodes(q, k_cache, v_cache, meta, scale, out)
            first_seq = 0  # not read: the tile map names the sequences
        else:
            # Rows past the last sequence's tokens (padding) are not written by the kernels: zero them.
            covered = meta.query_start_loc_cpu[-1] if meta.query_start_loc_cpu else 0
            if covered < num_tokens:
                out[covered:].zero_()
            # The decodes at the front take the decode kernel: in the prefill kernel each would fill a q
            # tile as tall as the longest chunk of the step with one real row.
            first_seq, longest = meta.leading_decodes
            if first_seq:
                self._decode(q, k_cache, v_cache, meta, scale, out, first_seq, longest)
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
            block_m=meta.tile_block_m or None,
            first_seq=first_seq,  # an offset, not sliced pointers: those would change Triton's specialisation
            tiles=meta.prefill_tiles,
            split_rows=meta.split_rows,
        )

    def _fixed_shape_decodes(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
    ) -> None:
        """The decodes of a mixed step inside a CUDA graph, where launch shapes are fixed by the graph's size:
        the decode kernel takes the first S rows (a zero output past the step's decodes) and cuts the step's
        decodes into splits on the GPU; the prefill kernel's tile map then names the chunks, whose rows it
        overwrites."""
        assert meta.decode_seq_lens is not None
        rows = meta.decode_seq_lens.shape[0]
        if rows < q.shape[0]:
            out[rows:].zero_()  # padding rows
        self._decode(
            q, k_cache, v_cache, meta, scale, out, rows, meta.max_seq_len, seq_lens=meta.decode_seq_lens,
            live=meta.decode_count,
        )  # fmt: skip

    @staticmethod
    def _decode(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
        batch: int,
        max_seq_len: int,
        new_kv: NewTokenKV | None = None,
        seq_lens: torch.Tensor | None = None,
        live: torch.Tensor | None = None,
    ) -> None:
        """Rows 0..batch-1 are sequences 0..batch-1, one new token each (already in the cache unless
        `new_kv` brings it), of `seq_lens` (default: the step's) keys; `live`: only the first `live` rows
        (on the device) are decodes (`paged_decode_attention`)."""
        num_splits = choose_num_splits(batch, k_cache.shape[2], max_seq_len, q.device)
        paged_decode_attention(
            q[:batch],
            k_cache,
            v_cache,
            meta.block_tables[:batch],
            (meta.seq_lens if seq_lens is None else seq_lens)[:batch],
            scale,
            out=out[:batch],
            num_splits=num_splits,
            new_kv=new_kv,
            order=meta.decode_order,
            pdl=new_kv is not None and new_kv.norm is not None and new_kv.norm.pdl,
            live=live,
        )

    def deferred_norm_pays(self, batch: int, head_dim: int) -> bool:
        """Finishing q/k/v costs every decode program a read of its row and, at head_dim 128, registers
        (capped at 128, with spills). Up to batch 128 that costs less than the norm launch it saves; at
        llama-3.1-8b's batch 256 it does not: attention 273 us against 264, the step 15.0 ms against 14.7
        (H200, 6b073a4)."""
        return head_dim < 128 or batch <= 128

    def warm_up(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        num_heads: int,
        dtype: torch.dtype,
        long_tile: bool = False,
    ) -> None:
        """The decode kernel of mixed steps picks its split count from the step's decodes, and each
        power-of-two bucket of it is a kernel variant: compile them all now. (Before this, and before the
        kernel stopped specialising on the split count and the block-table width, a fresh H200 compiled
        two variants inside W2's timed run and lost a fifth of its throughput to them.) `long_tile`: the
        planner gives long chunks LONG_TILE's maps, whose two variants compile too (`warm_up_long_tile`)."""
        if long_tile:
            warm_up_long_tile(k_cache, v_cache, num_heads, dtype)
        device = k_cache.device
        head_dim = k_cache.shape[-1]
        q = torch.zeros((1, num_heads, head_dim), dtype=dtype, device=device)
        table = torch.zeros((1, 3), dtype=torch.int32, device=device)  # a width of no special value
        seq_lens = torch.ones(1, dtype=torch.int32, device=device)
        order = torch.zeros(1, dtype=torch.int32, device=device)
        splits = 1
        while splits <= MAX_SPLITS:
            paged_decode_attention(q, k_cache, v_cache, table, seq_lens, 1.0, num_splits=splits, order=order)
            splits *= 2

    def copy_blocks(self, kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        copy_blocks(kv_cache, src, dst)


def warm_up_long_tile(
    k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int, dtype: torch.dtype
) -> None:
    """LONG_TILE's tile-map launches, of a map that cuts no key (on Hopper the warp-specialised kernel) and of one
    that does (the kernel with the merge): eager steps meet them first, and cold each compiles for seconds (1.4 s
    and 3.5 s on an H200), while every request in the step waits. One 128-row chunk over 128 cached keys, whose two key tiles the second map cuts
    in two; reads block 0 of the cache, writes nothing to it."""
    device = k_cache.device
    rows = LONG_TILE[0]
    q = torch.zeros((rows, num_heads, k_cache.shape[-1]), dtype=dtype, device=device)
    qsl = torch.tensor([0, rows], dtype=torch.int32, device=device)
    seq_lens = torch.tensor([2 * rows], dtype=torch.int32, device=device)
    table = torch.zeros((1, -(-2 * rows // k_cache.shape[1])), dtype=torch.int32, device=device)
    whole = [[0], [0], [0], [1], [0]]  # rows: sequence, q tile, key split, splits, first partial row
    halves = [[0, 0], [0, 0], [0, 1], [2, 2], [0, 0]]
    for tiles, split_rows in ((whole, 0), (halves, SPLIT_PARTIAL_ROWS)):
        tile_map = torch.tensor(tiles, dtype=torch.int32, device=device)
        paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            table,
            qsl,
            seq_lens,
            rows,
            1.0,
            block_m=rows,
            tiles=tile_map,
            split_rows=split_rows,
        )


register_backend("triton", TritonAttentionBackend)
