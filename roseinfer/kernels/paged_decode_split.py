"""How paged decode attention cuts sequences into splits (flash-decoding), and the ticket counters its
programs use to merge the splits within the same launch. Host-side only: no kernels here."""

from __future__ import annotations

import torch
import triton

from roseinfer.kernels._common import num_sms

# A split shorter than this many keys is not worth its partial write and merge.
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 32
# Aim for this many programs per SM: decode is bound by memory, and several resident programs per SM keep
# enough loads in flight (on H100, 3 keeps batch 64 x 8 kv heads at one split, its fastest).
PROGRAMS_PER_SM = 3


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """How many splits to cut each sequence into so that `batch * num_kv_heads * splits` fills the GPU.

    Uses only host ints (no device reads), so it is safe under CUDA-graph capture; the result is a launch
    shape, so a captured graph keeps the value it was captured with (it stays correct for any `seq_lens`).
    """
    programs = max(1, batch * num_kv_heads)
    target = PROGRAMS_PER_SM * num_sms(device)
    if programs >= target:
        return 1
    splits = triton.cdiv(target, programs)
    splits = min(splits, triton.cdiv(max(max_seq_len, 1), MIN_KEYS_PER_SPLIT), MAX_SPLITS)
    return max(1, splits)


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _key(device: torch.device) -> torch.device:
    """`cuda` and `cuda:0` are one device here."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def merge_counters(device: torch.device, needed: int) -> torch.Tensor:
    """A zeroed int32 ticket counter per (sequence, kv head), shared by every launch on `device`: each
    launch leaves it zeroed again. Allocated outside CUDA-graph capture (the engine warms up eagerly)."""
    counters = _COUNTERS.get(_key(device))
    if counters is None or counters.numel() < needed:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"paged decode attention needs {needed} merge counters but has "
                f"{0 if counters is None else counters.numel()}: run one eager step of this size before capture"
            )
        counters = torch.zeros(max(needed, 1 << 16), dtype=torch.int32, device=device)
        _COUNTERS[_key(device)] = counters
    return counters


def live_counters(device: torch.device) -> torch.Tensor | None:
    """The counters launches on `device` share, if any launch has split yet (for checks that they are 0)."""
    return _COUNTERS.get(_key(device))
