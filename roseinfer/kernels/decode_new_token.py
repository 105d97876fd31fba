"""What the step's own token brings to the paged decode kernel (`NewTokenKV`), and its shape checks."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeferredNorm:
    """q, k and v arrive unfinished: as `x @ (W * g).T`, the qkv projection of the rows `x` taken *before*
    their RMSNorm, whose weight g was folded into W. The kernel finishes them as it loads them: times
    1 / rms of x's row, plus the projection's bias, rounded to q's dtype (as the linear would round them).

    `x` [B, hidden] with a contiguous last dim; `bias` the fused qkv bias [(Hq + 2 * Hkv) * D] or None.
    """

    x: torch.Tensor
    eps: float
    bias: torch.Tensor | None = None


@dataclass(frozen=True)
class NewTokenKV:
    """Each sequence's own token of this step, which the decode kernel attends to and stores itself.

    `k`/`v` [B, Hkv, D] (views are fine); `slot_mapping` [B] is where they go in the cache (< 0: nowhere).
    With `rope` = (positions [B], cos_sin [max_pos, D] float32) the kernel also rotates q and k (neox
    halves) on the fly, so the step needs no separate rotary or KV-store launch. With `norm`, q, k and v
    are unfinished projections (`DeferredNorm`): the step needs no RMSNorm launch before its qkv GEMM.
    """

    k: torch.Tensor
    v: torch.Tensor
    slot_mapping: torch.Tensor
    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    norm: DeferredNorm | None = None


def check_new_kv(new_kv: NewTokenKV, batch: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    for name, t in (("k", new_kv.k), ("v", new_kv.v)):
        if t.dim() != 3 or t.shape[0] < batch or t.shape[1:] != (num_kv_heads, head_dim) or t.stride(-1) != 1:
            raise ValueError(
                f"new_kv.{name} must be [{batch}, {num_kv_heads}, {head_dim}] with a contiguous last dim, "
                f"got {tuple(t.shape)}"
            )
    if new_kv.slot_mapping.shape[0] < batch:
        raise ValueError("new_kv.slot_mapping has fewer rows than q")
    if new_kv.rope is not None:
        positions, cos_sin = new_kv.rope
        if positions.shape[0] < batch or cos_sin.dim() != 2 or cos_sin.shape[1] != head_dim:
            raise ValueError(f"new_kv.rope needs positions [{batch}] and cos_sin [max_pos, {head_dim}]")
    norm = new_kv.norm
    if norm is not None:
        x = norm.x
        if x.dim() != 2 or x.shape[0] < batch or x.stride(-1) != 1:
            raise ValueError(f"new_kv.norm.x must be [>= {batch}, hidden] with a contiguous last dim")
        qkv_width = (num_heads + 2 * num_kv_heads) * head_dim
        if norm.bias is not None and (norm.bias.shape != (qkv_width,) or not norm.bias.is_contiguous()):
            raise ValueError(
                f"new_kv.norm.bias must be a contiguous [{qkv_width}], got {tuple(norm.bias.shape)}"
            )
