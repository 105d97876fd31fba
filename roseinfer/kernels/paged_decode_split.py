"""How paged decode attention is launched: how it cuts sequences into splits (flash-decoding), the ticket
counters its programs use to merge the splits within the same launch, and its tile configuration.
Host-side only: no kernels here."""

from __future__ import annotations

import numpy as np
import torch

from roseinfer.kernels._common import cdiv, is_interpret, num_sms
from roseinfer.kv.cache_dtype import is_fp8

# A split shorter than this many keys is not worth its partial write and merge.
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 32
# Aim for this many programs per SM: decode is bound by memory, and several resident programs per SM keep
# enough loads in flight (on H100, 3 keeps batch 64 x 8 kv heads at one split, its fastest).
PROGRAMS_PER_SM = 3


def check_rows(
    q: torch.Tensor,
    head_dim: int,
    num_kv_heads: int,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    order: torch.Tensor | None,
    live: torch.Tensor | None,
    new_token: bool,
) -> None:
    """Raises ValueError where a decode launch's queries, rows, `order` or `live` do not fit together."""
    batch, num_q_heads, q_dim = q.shape
    if q_dim != head_dim:
        raise ValueError(f"q head_dim {q_dim} != cache head_dim {head_dim}")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if seq_lens.shape[0] < batch or block_tables.shape[0] < batch:
        raise ValueError("seq_lens/block_tables have fewer rows than q")
    if order is not None and (order.shape != (batch,) or order.dtype != torch.int32):
        raise ValueError(f"order must be int32 [{batch}], got {order.dtype} {tuple(order.shape)}")
    if live is not None and (order is None or new_token or live.dtype != torch.int32):
        raise ValueError("`live` (int32) takes an `order` and no new token")


def target_programs(device: torch.device) -> int:
    """The programs a decode launch aims for: PROGRAMS_PER_SM on each SM."""
    return PROGRAMS_PER_SM * num_sms(device)


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """How many splits to cut each sequence into so that `batch * num_kv_heads * splits` fills the GPU.

    Uses only host ints (no device reads), so it is safe under CUDA-graph capture; the result is a launch
    shape, so a captured graph keeps the value it was captured with (it stays correct for any `seq_lens`).
    """
    programs = max(1, batch * num_kv_heads)
    target = target_programs(device)
    if programs >= target:
        return 1
    splits = cdiv(target, programs)
    splits = min(splits, cdiv(max(max_seq_len, 1), MIN_KEYS_PER_SPLIT), MAX_SPLITS)
    return max(1, splits)


def decode_order(seq_lens: np.ndarray) -> np.ndarray:
    """The decode kernel's rows, longest sequence first (int32), for its `order`.

    In row order a long sequence launched near the end of the grid finishes alone: at batch 128 with
    contexts spread over 0.15-1.85x their mean, llama-3.1-8b's decode attention took 141.8 us a layer in
    row order and 123.8 us in this order (H100, scripts/sweep_decode_config.py; W2 llama +2%).
    """
    return np.argsort(-seq_lens.astype(np.int64), kind="stable").astype(np.int32)


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


def decode_config(
    head_dim_pad: int, dtype: torch.dtype, cache_dtype: torch.dtype | None = None
) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) for queries of `dtype` over a cache of `cache_dtype` (default: `dtype`)."""
    if is_interpret():
        return 32, 4, 1
    if dtype == torch.float32 or head_dim_pad > 128:
        return 32, 4, 2
    # Swept on H100/H200 (bf16, block size 16, CUDA-graph timed): 16 KiB K and V tiles are best; D=128 at
    # batch 64 x 4k reads K/V at ~97% of the device-to-device copy bandwidth. The kernel reads a tile's
    # block-table entries a tile ahead, so Triton 3.6 gives the K/V loads one shared-memory buffer at 2
    # stages and two at 3. Two buffers take 70 KiB, so 3 programs fit on an SM instead of 4, and at batch
    # 64 that was 8-13% slower (H100, scripts/sweep_decode_config.py, PERFORMANCE.md).
    if head_dim_pad <= 64:
        return 128, 4, 2
    # At head_dim 128 an fp8 cache takes twice the keys a tile for the same 16 KiB: llama-3.1-8b's heads at b=64,
    # ctx 4k, 282.2 -> 242.9 us a layer (H100, fp16 dots, sweep_decode_config.py --kv-cache-dtype fp8). At 64,
    # 256-key tiles won at one split but cost qwen2.5-0.5b's b=64 step 8% at the several its graphs run.
    if cache_dtype is not None and is_fp8(cache_dtype):
        return 128, 4, 2
    return 64, 4, 2


def launch_options(head_dim_pad: int, dtype: torch.dtype, deferred_norm: bool) -> dict[str, int]:
    """A register cap for the deferred-norm variant at head_dim 128 (half precision): uncapped it takes 164
    registers, so 3 programs fit on an SM instead of 4, and llama-3.1-8b's 512 programs at batch 64 ran in
    two waves: 102.6 us instead of 79.7. Capped at 128 (8 spills): 81.7 us (H200)."""
    if deferred_norm and head_dim_pad == 128 and dtype != torch.float32 and not is_interpret():
        return {"maxnreg": 128}
    return {}


def split_workspace(
    batch: int, num_q_heads: int, num_kv_heads: int, num_splits: int, head_dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a launch with several splits writes its partials to: m and l [B, Hq, S] and acc [B, Hq, S, D]
    (float32, contiguous), and the (sequence, kv head) ticket counters (`merge_counters`)."""
    part_m = torch.empty((batch, num_q_heads, num_splits), dtype=torch.float32, device=device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty((batch, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=device)
    return part_m, part_l, part_acc, merge_counters(device, batch * num_kv_heads)
