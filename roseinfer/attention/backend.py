"""The attention backend seam: the model calls `forward` once per layer; a backend registry picks it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.kernels.decode_new_token import DeferredNorm


class AttentionBackend(ABC):
    """Writes a layer's new K/V into the paged cache, then attends over each sequence's context.

    Invariants callers keep: `k_cache`/`v_cache` are the layer's strided views described in
    `AttentionMetadata`; every slot in `slot_mapping` (except -1) belongs to a block that only this
    sequence holds; the blocks in `block_tables` cover `seq_lens` tokens.
    """

    name: str = "abstract"
    fuses_rotary: bool = False  # forward() takes `rope` and rotates q/k itself
    # forward() takes `norm` on decode-only steps: q/k/v are unfinished projections (see DeferredNorm)
    defers_norm: bool = False
    # forward() reads `meta.prefill_tiles` (kernels/prefill_plan.py) on steps with prefill work
    takes_tile_maps: bool = False

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,  # (positions, cos_sin), if fuses_rotary
        norm: DeferredNorm | None = None,  # if defers_norm, on decode-only steps
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...

    def deferred_norm_pays(self, batch: int, head_dim: int) -> bool:
        """Whether a decode-only step of `batch` sequences should hand this backend a deferred norm (never
        unless it `defers_norm`)."""
        return self.defers_norm

    def warm_up(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        num_heads: int,
        dtype: torch.dtype,
        long_tile: bool = False,
    ) -> None:
        """Compile, before serving, kernel variants that steps would otherwise meet first mid-run (queries of
        `dtype`, the model's; `long_tile`: the tile planner may launch LONG_TILE); reads the cache, writes
        nothing to it. Nothing to do by default."""
        return None

    def copy_blocks(self, kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """`kv_cache[dst[i]] = kv_cache[src[i]]` for all i in one batched operation (copy-on-write)."""
        kv_cache[dst] = kv_cache[src]


_REGISTRY: dict[str, Callable[[], AttentionBackend]] = {}


def register_backend(name: str, factory: Callable[[], AttentionBackend]) -> None:
    _REGISTRY[name] = factory


def get_backend(name: str) -> AttentionBackend:
    if name not in _REGISTRY:
        # Backends register themselves on import; import lazily so CPU installs never need Triton.
        if name == "torch":
            import roseinfer.attention.torch_backend  # noqa: F401
        elif name == "triton":
            import roseinfer.attention.triton_backend  # noqa: F401
    if name not in _REGISTRY:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]()
