"""The decode step's lm_head and sampler: cuBLAS then `sampling.sample_tokens` (the engine's path before
`kernels/logits_sample.py`) against `logits_and_sample` (the sampler in the GEMM's epilogue) at a sweep of
tiles, us a step, each in a CUDA graph replayed back to back. GPU only.

    python scripts/probe_logits_sample.py --model-shape qwen2.5-0.5b --rows 16,64 --temperature 0,0.6
    python scripts/probe_logits_sample.py --rows 128,256 --row-block 64,128 --warps 4,8
"""

from __future__ import annotations

import argparse
import itertools
import os

import torch

from roseinfer.bench.kernels import _graph_back_to_back_ms
from roseinfer.config import ModelConfig
from roseinfer.kernels.logits_sample import default_tile, logits_and_sample
from roseinfer.kernels.sampling import sample_tokens
from roseinfer.kernels.skinny_gemm import MAX_ROWS, GemmTile
from roseinfer.models.loader import BUILTIN_CONFIG_DIR


def sweep(w: torch.Tensor, rows: int, temp: float, tiles: list[tuple[GemmTile, int]], top: int) -> None:
    dev = w.device
    gen = torch.Generator(device=dev).manual_seed(rows)
    h = torch.randn(rows, w.shape[1], device=dev, generator=gen).to(w.dtype)
    seeds = torch.arange(rows, device=dev, dtype=torch.int64)
    t = torch.full((rows,), temp, device=dev)
    tokens = torch.zeros(rows, dtype=torch.int32, device=dev)
    logits = torch.empty(rows, w.shape[0], dtype=w.dtype, device=dev)

    def engine() -> None:
        torch.mm(h, w.t(), out=logits)
        tokens.copy_(sample_tokens(logits, t, seeds))

    base = _graph_back_to_back_ms(engine, 1) * 1e3
    engine()
    want = tokens.clone()
    shipped = default_tile(rows)
    results = []
    for tile, rb in tiles:
        try:
            us = _graph_back_to_back_ms(
                lambda tile=tile, rb=rb: logits_and_sample(h, w, t, seeds, tokens, True, tile, rb), 1
            )
        except Exception as e:  # noqa: BLE001 - a tile that does not compile is reported, not fatal
            print(f"  {tile} rows {rb}: {type(e).__name__}")
            continue
        tokens.zero_()
        logits_and_sample(h, w, t, seeds, tokens, True, tile, rb)
        results.append((us * 1e3, tile, rb, bool(torch.equal(tokens, want))))
    results.sort(key=lambda r: r[0])
    gb = w.numel() * w.element_size() / 1e9
    print(
        f"rows {rows} T {temp}: cuBLAS + sample_tokens {base:.1f} us ({gb * 1e3 / base:.2f} TB/s of weights)"
    )
    for i, (us, tile, rb, same) in enumerate(results):
        is_shipped = tile == shipped and min(rb, rows) == min(MAX_ROWS, rows)
        if i < top or is_shipped:
            mark = "  (shipped)" if is_shipped else ""
            print(
                f"  {us:7.1f} us {gb * 1e3 / us:5.2f} TB/s  bn {tile.block_n} bk {tile.block_k} "
                f"st {tile.num_stages} w {tile.num_warps} rows/program {min(rb, rows)}  "
                f"tokens {'equal' if same else 'differ'}{mark}"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-shape", default="qwen2.5-0.5b")
    p.add_argument("--rows", default="64")
    p.add_argument("--temperature", default="0,0.6")
    p.add_argument("--block-n", default="32,64,128")
    p.add_argument("--block-k", default="64,128")
    p.add_argument("--stages", default="3,4,5")
    p.add_argument("--warps", default="4")
    p.add_argument("--row-block", default="64", help="rows a program takes (more rows: more programs)")
    p.add_argument("--top", type=int, default=6)
    args = p.parse_args()
    cfg = ModelConfig.from_path(os.path.join(BUILTIN_CONFIG_DIR, f"{args.model_shape}.json"))
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    w = (torch.randn(cfg.vocab_size, cfg.hidden_size, device=dev, generator=gen) / 32).to(torch.bfloat16)
    sweeps = (args.block_n, args.block_k, args.stages, args.warps, args.row_block)
    ints = [[int(v) for v in a.split(",")] for a in sweeps]
    tiles = [(GemmTile(bn, bk, 1, wp, st), rb) for bn, bk, st, wp, rb in itertools.product(*ints)]
    print(f"{args.model_shape}: lm_head {cfg.vocab_size} x {cfg.hidden_size}, bf16")
    for rows in (int(r) for r in args.rows.split(",")):
        for temp in (float(t) for t in args.temperature.split(",")):
            sweep(w, rows, temp, tiles, args.top)


if __name__ == "__main__":
    main()
