"""Small host-side helpers shared by the Triton kernels."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from roseinfer.kv.cache_dtype import check_cache_dtype, is_fp8

LOG2E = 1.4426950408889634


def cdiv(x: int, y: int) -> int:
    """`triton.cdiv` for host code. Triton's is a constexpr function: each call from Python unwraps its arguments
    and costs ~6 us on the CPU machines (~0.2 us this way), and an eager step's layer makes a dozen such calls."""
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    """`triton.next_power_of_2` for host code (see `cdiv`): 0 for n <= 0, as there."""
    return 1 << (int(n) - 1).bit_length() if n > 0 else 0


def is_interpret() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1), read as Triton reads
    it: "true", "on" and "yes" are set too, and "false", "off" and "no" are not."""
    return bool(triton.knobs.runtime.interpret)


def _install_interpreter_index_fix() -> None:
    """Let the Triton interpreter use loaded scalars as `range` bounds under numpy >= 2.4.

    The interpreter holds scalars as 1-element arrays and converts them with `int(array)`, which numpy 2.4
    rejects (triton-lang/triton#9171, fixed after Triton 3.6). Only the interpreter is touched, and only in
    interpret mode.
    """
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_roseinfer_index_fix", False):
        return

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._roseinfer_index_fix = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


if is_interpret():
    _install_interpreter_index_fix()


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def _cuda_max_shared(index: int) -> int:
    return triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]


def max_shared_memory(device: torch.device) -> int | None:
    """Bytes of shared memory one program of a Triton kernel may take on `device` (the opt-in maximum, as
    Triton checks it); None off CUDA, where nothing caps it."""
    if device.type != "cuda" or is_interpret():
        return None
    return _cuda_max_shared(device.index if device.index is not None else torch.cuda.current_device())


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (a small stand-in on CPU, where any value is correct)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_sm_count(index)
    return 4


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot` input precision: full fp32 for fp32 inputs (Triton would use tf32), native otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """Operand type for `tl.dot`: the tensors' own, except bf16 under the interpreter (its bf16 dot is
    wrong: it multiplies the raw bits), where operands are rounded to bf16 first and multiplied in fp32."""
    if dtype not in _TL_DTYPES:
        raise ValueError(f"unsupported dtype {dtype}")
    if dtype == torch.bfloat16 and is_interpret():
        return tl.float32
    return _TL_DTYPES[dtype]


def attention_dot_dtype(q_dtype: torch.dtype, cache_dtype: torch.dtype) -> torch.dtype:
    """The operand type of attention's two dots over a cache of `cache_dtype`. An fp8 cache's K/V widen to
    fp16 where the model is bf16: e4m3 -> f16 is one conversion instruction a pair, e4m3 -> bf16 goes through
    fp32, and fp16 holds every fp8 value and the softmax weights with more mantissa than bf16 (the kernels
    clamp q to fp16's range). Otherwise the queries' own type (`dot_dtype` narrows it further)."""
    if is_fp8(cache_dtype) and q_dtype == torch.bfloat16:
        return torch.float16
    return q_dtype


def check_paged_cache(
    k_cache: torch.Tensor, v_cache: torch.Tensor, q_dtype: torch.dtype
) -> tuple[int, int, int]:
    """Validate a layer's cache views for queries of `q_dtype`; returns (block_size, num_kv_heads, head_dim)."""
    check_cache_dtype(k_cache.dtype, q_dtype)
    check_cache_dtype(v_cache.dtype, q_dtype)
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"k_cache/v_cache must be [num_blocks, block_size, num_kv_heads, head_dim] of one shape, "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache/v_cache last dim must be contiguous")
    block_size = k_cache.shape[1]
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    return block_size, k_cache.shape[2], k_cache.shape[3]


def gather_sequence_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence's first `seq_len` keys and values, `[seq_len, Hkv, D]` each, read through its block table."""
    block_size = k_cache.shape[1]
    pos = torch.arange(seq_len, device=k_cache.device)
    blocks = block_table.to(torch.int64)[pos // block_size]
    offs = pos % block_size
    return k_cache[blocks, offs], v_cache[blocks, offs]
