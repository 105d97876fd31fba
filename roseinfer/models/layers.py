"""Building blocks shared by the model files: norms, rotary embedding, activations, attention."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from roseinfer.attention.backend import AttentionBackend
from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.kernels.decode_new_token import DeferredNorm


@dataclass
class ForwardContext:
    """What every layer needs for one step besides its input: the cache, the batch layout, the backend."""

    kv_cache: torch.Tensor  # [num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata
    backend: AttentionBackend


def fused_kernels_for(x: torch.Tensor) -> bool:
    """Fused Triton kernels on CUDA tensors (one launch instead of many small ones); torch elsewhere."""
    return x.is_cuda and _HAS_TRITON


try:
    from roseinfer.kernels import activation as _act
    from roseinfer.kernels import qk_norm as _qk_norm
    from roseinfer.kernels import rmsnorm as _rms
    from roseinfer.kernels import rotary as _rope
    from roseinfer.kernels.gemv import gemv
    from roseinfer.kernels.skinny_gemm import skinny_gemm

    _HAS_TRITON = True
except ImportError:  # CPU installs without Triton
    _HAS_TRITON = False

    def gemv(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("the one-token GEMV needs Triton")

    def skinny_gemm(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("the skinny GEMM needs Triton")


def project(x: torch.Tensor, weight: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """`x @ weight.T`: with `pdl`, the skinny Triton GEMM joining a programmatic-dependent-launch chain
    (`kernels/pdl.py`); else torch's GEMM."""
    return skinny_gemm(x, weight, pdl=True) if pdl else torch.mm(x, weight.t())


def add_project_(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, pdl: bool = False) -> None:
    """`out += x @ weight.T` in place, as `project` chooses (torch: one GEMM with beta = 1)."""
    if pdl:
        skinny_gemm(x, weight, out=out, add=True, pdl=True)
    else:
        out.addmm_(x, weight.t())


def copy_checkpoint_tensor(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    """`dst.copy_(src)` for a checkpoint tensor `name`, refusing a shape that differs (copy_ would broadcast
    or fail without naming the tensor)."""
    if dst.shape != src.shape:
        raise ValueError(
            f"checkpoint tensor {name!r} has shape {tuple(src.shape)} where the model built from config.json "
            f"expects {tuple(dst.shape)}: the config does not match the weights"
        )
    dst.copy_(src)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, as HF does; `forward(x, residual)` fuses the residual add."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, pdl: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`pdl`: the Triton kernel joins a programmatic-dependent-launch chain (`kernels/pdl.py`)."""
        if fused_kernels_for(x):
            shape = x.shape
            x2 = x.reshape(-1, shape[-1])
            if residual is None:
                return _rms.rmsnorm(x2, self.weight, self.eps, pdl=pdl).view(shape)
            out = _rms.rmsnorm(x2, self.weight, self.eps, residual)  # residual becomes x + residual
            return out.view(shape), residual
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """Neox-style rotary embedding (HF `rotate_half`), with a cos/sin table built once per device."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None):
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.theta = theta
        self.scaling = scaling
        self.cos_sin: torch.Tensor | None = None  # [max_positions, head_dim] float32: cos half | sin half

    def build(self, device: torch.device) -> None:
        """Computed on the CPU in float32 exactly as HF does, then moved (models are built on 'meta')."""
        cpu = torch.device("cpu")
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=cpu).float() / self.head_dim
        inv_freq = 1.0 / (self.theta**exponents)
        if self.scaling is not None:
            inv_freq = _llama3_inv_freq(inv_freq, self.scaling)
        pos = torch.arange(self.max_positions, dtype=torch.float32, device=cpu)
        freqs = torch.outer(pos, inv_freq)
        self.cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device)

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
        assert self.cos_sin is not None, "RotaryEmbedding.build() was not called"
        if fused_kernels_for(q):
            _rope.apply_rotary(q, k, positions, self.cos_sin)  # in place
            return q, k
        cos, sin = self.cos_sin[positions].chunk(2, dim=-1)  # [T, D/2] each
        cos = torch.cat([cos, cos], dim=-1).unsqueeze(1).to(q.dtype)
        sin = torch.cat([sin, sin], dim=-1).unsqueeze(1).to(q.dtype)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def normalize_qk(
    qkv: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's per-head q/k norms. On CUDA one launch normalises the q and k heads in place in `qkv`, the
    fused projection that the views q [T, Hq, D] and k [T, Hkv, D] read, and returns those views."""
    if fused_kernels_for(qkv) and q_norm.eps == k_norm.eps:
        hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
        _qk_norm.qk_norm_(qkv, hq, hkv, d, q_norm.weight, k_norm.weight, q_norm.eps)
        return q, k
    return q_norm(q), k_norm(k)


def silu_and_mul(
    x: torch.Tensor, rms_of: torch.Tensor | None = None, eps: float = 0.0, pdl: bool = False
) -> torch.Tensor:
    """With `rms_of`, x is a projection of those rows before their RMSNorm: scaled by 1 / rms first (Triton).
    `pdl`: the Triton launch joins a programmatic-dependent-launch chain (`kernels/pdl.py`)."""
    if fused_kernels_for(x):
        return _act.silu_and_mul(x, rms_of, eps, pdl)
    if rms_of is not None:
        raise ValueError("a deferred norm in silu_and_mul needs the Triton kernel")
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


# cuBLASLt picks a faster kernel than cuBLAS for a down GEMM with a long K at decode batch sizes. H100, bf16,
# llama-3.1-8b's [4096 x 14336] (scripts/probe_gemm_layouts.py): 44.5 us against 48.3 at 64 rows, 46.4 against
# 54.2 at 128; the same at 16 and at 8192 rows, 3-5% slower at 192 and 256. For qwen2.5-0.5b's K of 4864 it is
# no faster (3% slower at 256 rows).
LT_DOWN_MIN_K = 8192
LT_DOWN_ROWS = (32, 128)


def down_blas_library(rows: int, k: int, is_cuda: bool) -> str | None:
    """The BLAS library for an MLP down GEMM of [rows, k] activations: cuBLASLt where it measured faster,
    else None (torch's default)."""
    if is_cuda and k >= LT_DOWN_MIN_K and LT_DOWN_ROWS[0] <= rows <= LT_DOWN_ROWS[1]:
        return "cublaslt"
    return None


_NO_CHANGE = contextlib.nullcontext()


def preferred_blas(library: str | None) -> contextlib.AbstractContextManager[None]:
    """Run the block's CUDA GEMMs with `library` ('cublas' or 'cublaslt'), then restore torch's preference;
    None changes nothing (and costs nothing per layer). A captured CUDA graph keeps the kernels chosen at
    capture."""
    return _NO_CHANGE if library is None else _blas_library(library)


@contextlib.contextmanager
def _blas_library(library: str) -> Iterator[None]:
    previous = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(previous)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "gelu": F.gelu}


def paged_attention(
    layer_idx: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: ForwardContext,
    scale: float,
    positions: torch.Tensor | None = None,
    rotary: RotaryEmbedding | None = None,
    norm: DeferredNorm | None = None,
) -> torch.Tensor:
    """q/k/v are [T, heads, head_dim]; returns [T, heads * head_dim]. With `rotary`, q and k are rotated
    first: inside the backend's KV write when it fuses the two (one launch), else here. With `norm` they are
    unfinished projections that the backend finishes (decode-only steps of a backend that `defers_norm`)."""
    rope = None
    if rotary is not None:
        assert positions is not None and rotary.cos_sin is not None
        if ctx.backend.fuses_rotary and fused_kernels_for(q):
            rope = (positions, rotary.cos_sin)
        else:
            q, k = rotary(positions, q, k)
    if norm is not None and rotary is not None and rope is None:
        raise ValueError("a deferred norm must be applied before rotary: the backend must fuse both")
    caches = (ctx.kv_cache[:, layer_idx, 0], ctx.kv_cache[:, layer_idx, 1])
    out = ctx.backend.forward(q, k, v, *caches, ctx.meta, scale, rope, norm)
    return out.reshape(out.shape[0], -1)
