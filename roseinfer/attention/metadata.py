"""What one step's attention needs, built once per step by the runner and shared by all layers."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass
class AttentionMetadata:
    """Flattened batch of `num_seqs` sequences with `num_tokens` new tokens in total.

    Tokens of sequence i occupy rows `query_start_loc[i]:query_start_loc[i+1]` of q/k/v. Those new
    tokens sit at the end of the sequence's context: sequence i's context after this step has
    `seq_lens[i]` tokens, of which the last `q_len_i` are the new ones (so the j-th new token has
    position `seq_lens[i] - q_len_i + j` and attends causally to context positions `<= ` that).

    KV cache layout (block-major): the whole cache is one tensor
    `[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]`; a layer sees
    `k_cache = kv[:, layer, 0]` and `v_cache = kv[:, layer, 1]`, strided views of shape
    `[num_blocks, block_size, num_kv_heads, head_dim]` (last dim contiguous). Token t of a sequence
    lives in block `block_tables[i, t // block_size]` at offset `t % block_size`.

    `slot_mapping[r]` is `block_id * block_size + offset` for row r's new K/V, or -1 for padding rows
    (CUDA-graph padding) that must be neither written nor read.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32 (unused entries arbitrary)
    max_query_len: int
    max_seq_len: int
    # Host copies, for the reference backend and for launch decisions; never read on the GPU.
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    # The prefill kernel's tile map [TILE_ROWS, N] (kernels/prefill_plan.py), its q tile height, and the
    # partial rows its key splits may take (0: none). Set inside the mixed-step CUDA graphs
    # (runner/mixed_graphs.py), where no launch shape may depend on the step, and on eager steps whose
    # chunks' keys are worth splitting.
    prefill_tiles: torch.Tensor | None = None
    tile_block_m: int = 0
    split_rows: int = 0
    # Inside the mixed-step graphs: [S] each sequence's length if it is one of the leading decodes, else 0
    # (the decode kernel's rows).
    decode_seq_lens: torch.Tensor | None = None
    # Inside the mixed-step graphs: [1] the step's leading decodes, from which the decode kernel picks its
    # splits on the GPU (kernels/decode_split_merge.gpu_split).
    decode_count: torch.Tensor | None = None
    # [D] the decode kernel's rows (the step's leading decodes, or in a mixed-step graph all S rows), longest
    # sequence first (kernels/paged_decode_split.decode_order); None: row order.
    decode_order: torch.Tensor | None = None

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1

    @cached_property
    def leading_decodes(self) -> tuple[int, int]:
        """(d, longest): the first d sequences have one new token each (decode-first puts decodes at the
        front), the longest of them has `longest` tokens. A mixed step gives them the decode kernel."""
        qsl, lens = self.query_start_loc_cpu, self.seq_lens_cpu
        d = 0
        while d < len(qsl) - 1 and qsl[d + 1] - qsl[d] == 1:
            d += 1
        return d, max(lens[:d], default=0)
