"""Paged decode attention, qwen2.5-0.5b heads (14 q / 2 kv, D=64), batch 64: graph-replay time per split
count at short and long contexts, to check `choose_num_splits` (GPU only). Prints one row per case."""

from __future__ import annotations

import torch

from roseinfer.bench.kernels import _graph_median_ms, _paged_cache
from roseinfer.kernels.paged_decode_attention import paged_decode_attention
from roseinfer.kernels.paged_decode_split import choose_num_splits


def main() -> None:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    batch, hq, hkv, d, bs = 64, 14, 2, 64, 16
    print("ctx  splits  chosen  ms       kv_GBps")
    for ctx in (600, 1024, 4096):
        kv, k_cache, v_cache, tables = _paged_cache(batch, ctx, bs, hkv, d, torch.bfloat16, gen)
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
        q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device=device, generator=gen)
        out = torch.empty_like(q)
        chosen = choose_num_splits(batch, hkv, ctx, device)
        kv_bytes = 2 * batch * ctx * hkv * d * 2
        args = (q, k_cache, v_cache, tables, seq_lens, 0.125, out)
        for splits in (1, 2, 3, 4, 6, 8):
            ms = _graph_median_ms(lambda s=splits, a=args: paged_decode_attention(*a, s))
            print(f"{ctx:<4} {splits:<7} {chosen:<7} {ms:.5f}  {kv_bytes / ms / 1e6:.0f}")


if __name__ == "__main__":
    main()
