"""Writing K/V into the cache in its element type (kv/cache_dtype.py): the Triton side of `to_cache_dtype`,
which is its torch reference."""

from __future__ import annotations

import triton
import triton.language as tl

from roseinfer.kernels._common import is_interpret

_INTERPRET = tl.constexpr(is_interpret())


@triton.jit
def _round_to_fp8_grid(x, MANT: tl.constexpr, MIN_EXP: tl.constexpr):
    """`x` (fp32, within the type's range) rounded to nearest-even on an fp8 type's grid, exactly, in fp32.
    Under Triton's interpreter only: its own fp32 -> fp8 conversion drops the carry into the next binade
    (1.94 -> 1.0 in e4m3) and rounds ties up."""
    a = tl.abs(x)
    exp = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    exp = tl.maximum(exp, MIN_EXP)  # subnormals share the smallest normal binade's step
    step = ((exp - MANT + 127) << 23).to(tl.float32, bitcast=True)
    # a / step < 2^(MANT+1) is exact; adding and taking away 2^23 rounds it to an integer, ties to even.
    r = ((a / step + 8388608.0) - 8388608.0) * step
    return tl.where(x < 0, -r, r)


@triton.jit
def to_cache(x, DTYPE: tl.constexpr):
    """`x` as a cache of DTYPE stores it: clamped to an fp8 type's finite range, then rounded."""
    if DTYPE == tl.float8e4nv:
        x = tl.clamp(x.to(tl.float32), -448.0, 448.0)
        if _INTERPRET:
            x = _round_to_fp8_grid(x, 3, -6)
    elif DTYPE == tl.float8e5:
        x = tl.clamp(x.to(tl.float32), -57344.0, 57344.0)
        if _INTERPRET:
            x = _round_to_fp8_grid(x, 2, -14)
    return x.to(DTYPE)


@triton.jit
def through_cache(x, DTYPE: tl.constexpr):
    """`x` as it will read back from a cache of DTYPE (in fp32): rounded where the cache is fp8, else as is,
    so a step that attends its own new token from registers sees what later steps read from the cache."""
    if DTYPE.is_fp8():
        x = to_cache(x, DTYPE).to(tl.float32)
    return x
