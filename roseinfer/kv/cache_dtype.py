"""The KV cache's element type: the model's own ("auto"), or an fp8 type that halves the bytes a decode step
reads from the cache (`--kv-cache-dtype fp8`, as vLLM names it).

An fp8 cache stores K/V without a scale (vLLM's default, scale 1.0): a value is clamped to the type's finite
range and rounded. Attention widens what it reads back to the model's dtype, so only the stored K/V lose
precision; queries, softmax and the output keep theirs.
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def check_kv_cache_dtype_name(name: str) -> None:
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {sorted(KV_CACHE_DTYPES)}, got {name!r}")


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype the KV cache is allocated with."""
    check_kv_cache_dtype_name(name)
    return KV_CACHE_DTYPES[name] or model_dtype


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def check_cache_dtype(cache_dtype: torch.dtype, compute_dtype: torch.dtype) -> None:
    """A cache holds K/V in the dtype of the q/k/v that attention computes with, or in an fp8 type."""
    if cache_dtype != compute_dtype and not is_fp8(cache_dtype):
        raise ValueError(
            f"the KV cache must be {compute_dtype} (the model's dtype) or fp8 "
            f"(float8_e4m3fn / float8_e5m2), got {cache_dtype}"
        )


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` as the cache stores it: clamped to an fp8 type's finite range before rounding (torch would give
    inf or NaN past it), else a plain cast. The reference for `kernels/cache_cast.to_cache`."""
    if is_fp8(dtype):
        limit = torch.finfo(dtype).max
        return x.float().clamp(-limit, limit).to(dtype)
    return x.to(dtype)


def check_fp8_cache_support(cache_dtype: torch.dtype, device: torch.device, attention_backend: str) -> None:
    """Triton converts fp8 in hardware from sm_89 (Ada, Hopper) on; the torch backend runs it anywhere."""
    if not is_fp8(cache_dtype) or device.type != "cuda" or attention_backend != "triton":
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        raise ValueError(
            f"an fp8 KV cache with the triton attention backend needs compute capability 8.9 or newer; "
            f"{torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}"
        )
