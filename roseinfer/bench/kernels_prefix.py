"""`bench kernels --long-prefix`: a chunk of new tokens attending over a long paged prefix, as W7's first round runs
prefill (1024-token steps over 10240-token prompts), through roseinfer's prefill kernel (with the tile map and key
splits an eager engine step plans), torch SDPA's flash backend (FlashAttention 2) on the same keys made contiguous,
and, where vLLM's bundle imports, vLLM's FlashAttention 3 on the same paged cache. GPU only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

CHUNK = 1024
PREFIXES = (4096, 9216)  # W7's chunk halfway through a prompt, and its last one
LLAMA_HEADS = (32, 8, 128)  # query heads, KV heads, head dim
BLOCK_SIZE = 16


def prefix_chunk_flops(chunk: int, prefix: int, num_heads: int, head_dim: int) -> float:
    """FLOPs of `chunk` new tokens attending over `prefix` cached tokens and causally over themselves: QK^T and PV,
    2 FLOPs a multiply-add."""
    pairs = chunk * prefix + chunk * (chunk + 1) / 2
    return 4 * num_heads * head_dim * pairs


def gather_contiguous(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """One sequence's keys or values in order, [length, Hkv, D], read through its block table."""
    return cache[block_table.long()].reshape(-1, *cache.shape[2:])[:length]


def vllm_fa3() -> Callable[..., Any] | None:
    """vLLM's `flash_attn_varlen_func` where its bundle imports and FA3 runs on this GPU; None otherwise."""
    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func
        from vllm.vllm_flash_attn.flash_attn_interface import is_fa_version_supported
    except Exception:  # not installed, or built for another torch: the row is left out
        return None
    return flash_attn_varlen_func if is_fa_version_supported(3) else None


def bench_prefix_chunk(
    prefix: int,
    gen: torch.Generator,
    timer: Callable[[Callable[[], None]], float],
    chunk: int = CHUNK,
    heads: tuple[int, int, int] = LLAMA_HEADS,
) -> list[dict]:
    """Rows for one chunk over `prefix` cached tokens: ms, TFLOP/s, each one's time over ours, and its largest
    difference from SDPA's output."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    from roseinfer.bench.device import sync
    from roseinfer.bench.kernels import _paged_cache
    from roseinfer.kernels.paged_prefill_attention import paged_prefill_attention
    from roseinfer.kernels.prefill_plan import TilePlanner, partial_rows

    num_heads, num_kv_heads, head_dim = heads
    dtype, device = torch.bfloat16, gen.device
    ctx = prefix + chunk
    _, k_cache, v_cache, block_tables = _paged_cache(1, ctx, BLOCK_SIZE, num_kv_heads, head_dim, dtype, gen)
    q = torch.empty((chunk, num_heads, head_dim), dtype=dtype, device=device).normal_(generator=gen)
    scale = head_dim**-0.5
    qsl_np, lens_np = np.array([0, chunk], np.int32), np.array([ctx], np.int32)
    qsl = torch.from_numpy(qsl_np).to(device)
    seq_lens = torch.from_numpy(lens_np).to(device)
    planned = TilePlanner(num_heads, head_dim, dtype, device, block_size=BLOCK_SIZE).eager_map(qsl_np, lens_np)
    tiles = torch.from_numpy(planned[0]).to(device) if planned else None
    block_m = planned[1] if planned else None
    split_rows = partial_rows(planned[0]) if planned else 0
    # the tile the eager step launches (LONG_TILE's 128 rows for W7's chunks) and its most key splits a tile
    plan = f"block_m={block_m or 'default'} splits={int(planned[0][3].max()) if planned else 1}"
    out = torch.empty_like(q)

    def ours() -> None:
        paged_prefill_attention(
            q, k_cache, v_cache, block_tables, qsl, seq_lens, chunk, scale, out=out,
            block_m=block_m, tiles=tiles, split_rows=split_rows,
        )  # fmt: skip

    group = num_heads // num_kv_heads
    ks = gather_contiguous(k_cache, block_tables[0], ctx).repeat_interleave(group, 1).transpose(0, 1)[None]
    vs = gather_contiguous(v_cache, block_tables[0], ctx).repeat_interleave(group, 1).transpose(0, 1)[None]
    qs = q.transpose(0, 1)[None]
    mask = causal_lower_right(chunk, ctx)
    ref: dict[str, torch.Tensor] = {}

    def sdpa() -> None:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref["sdpa"] = torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, scale=scale
            )

    candidates: list[tuple[str, Callable[[], None]]] = [("paged_prefill", ours), ("sdpa_flash", sdpa)]
    fa3 = vllm_fa3()
    if fa3 is not None:
        fa3_out = torch.empty_like(q)

        def vllm_fa3_call() -> None:
            fa3(
                q, k_cache, v_cache, max_seqlen_q=chunk, cu_seqlens_q=qsl, max_seqlen_k=ctx, seqused_k=seq_lens,
                softmax_scale=scale, causal=True, block_table=block_tables, out=fa3_out, fa_version=3,
            )  # fmt: skip

        try:  # a peer that refuses this cache's layout costs its row, not the others
            vllm_fa3_call()
            candidates.append(("vllm_fa3", vllm_fa3_call))
        except Exception as e:
            print(f"vLLM's FA3 refused the chunk over {prefix} cached tokens: {e!r}")
    for _, fn in candidates:
        fn()
    sync(device)
    want = ref["sdpa"][0].transpose(0, 1).float()
    errors = {"paged_prefill": (out.float() - want).abs().max().item(), "sdpa_flash": 0.0}
    if len(candidates) == 3:
        errors["vllm_fa3"] = (fa3_out.float() - want).abs().max().item()
    flops = prefix_chunk_flops(chunk, prefix, num_heads, head_dim)
    times = {name: timer(fn) for name, fn in candidates}
    shape = (
        f"{chunk} new over {prefix} cached, Hq={num_heads} Hkv={num_kv_heads} D={head_dim} bs={BLOCK_SIZE}"
    )
    return [
        {
            "kernel": name,
            "model": "llama-3.1-8b",
            "shape": shape + (f" {plan}" if name == "paged_prefill" else ""),
            "ms": ms,
            "tflops": flops / (ms * 1e-3) / 1e12,
            "x_ours": ms / times["paged_prefill"],
            "max_abs_err_vs_sdpa": errors[name],
        }
        for name, ms in times.items()
    ]


def run_prefix_chunk_bench(gen: torch.Generator, timer: Callable[[Callable[[], None]], float]) -> list[dict]:
    rows: list[dict] = []
    for prefix in PREFIXES:
        rows += bench_prefix_chunk(prefix, gen, timer)
        torch.cuda.empty_cache()
    if vllm_fa3() is None:
        print(
            "vLLM's FA3 did not import (PYTHONPATH=/tmp/vsite:... on the GPU machine): its rows are left out"
        )
    return rows
