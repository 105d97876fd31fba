"""Micro-benchmarks of the attention kernels (GPU only).

Decode: batch 64 at 4k context, bf16, block size 16, for a Qwen2.5-0.5B-like (14 q / 2 kv heads, D=64) and
a Llama-3.1-8B-like (32 q / 8 kv heads, D=128) layer. The figure of merit is the K/V read bandwidth
(bytes of K and V read / time) against the device-to-device copy bandwidth measured in the same run
(bytes read + written / time). `ms` is per launch in a CUDA graph of DECODE_LAYERS layers (distinct caches,
so K/V come from HBM) replayed back to back: how a decode step's graph runs attention, layer after layer.
`ms_1layer_flushed` is a one-launch graph under triton's do_bench, which zeroes 256 MB before every replay
and times each one alone: the L2's dirty lines and the graph launch add ~8 us (the figure this benchmark
printed before the eighth session; `scripts/probe_graph_timing.py` takes the gap apart). `ms_eager` is the
plain Python call, launch overhead included.

Prefill: 4 sequences x 2k tokens, 32 q / 8 kv heads, D=128, bf16, causal, against torch SDPA restricted to
its flash backend on the same (contiguous) inputs. `--long-prefix` adds a chunk over a long prefix (`kernels_prefix`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

DECODE_MODELS = (
    ("qwen2.5-0.5b", 14, 2, 64),
    ("llama-3.1-8b", 32, 8, 128),
)
DECODE_LAYERS = 4


def _median_ms(fn: Any) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _graph_median_ms(fn: Any) -> float:
    """Median time of `fn` captured in a CUDA graph and replayed: GPU time without Python launch overhead,
    as the engine runs decode."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _median_ms(graph.replay)


def _graph_back_to_back_ms(fn: Any, launches: int, replays: int = 20, rounds: int = 5) -> float:
    """Median time per launch of `fn` (which makes `launches` kernel launches) captured in a CUDA graph and
    replayed `replays` times back to back: no cache flush, no event between replays."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / (replays * launches))
    return sorted(times)[rounds // 2]


def _copy_bandwidth_gbs(device: torch.device, nbytes: int = 1 << 30) -> tuple[float, float]:
    """(GB/s counting bytes read + written, ms) of one large device-to-device copy."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src))
    return copy_rate_gbs(nbytes, ms), ms


def copy_rate_gbs(nbytes: int, ms: float) -> float:
    """GB/s of a copy of `nbytes` bytes taking `ms`, counting bytes read plus bytes written."""
    return 2 * nbytes / (ms * 1e-3) / 1e9


def decode_figures(
    batch: int,
    ctx: int,
    num_kv_heads: int,
    head_dim: int,
    itemsize: int,
    ms: float,
    ms_1layer_flushed: float,
    copy_gbs: float,
) -> dict[str, float]:
    """A decode row's bandwidth figures: the K and V bytes of `batch` sequences of `ctx` tokens read in `ms` per
    launch, against the copy bandwidth; `pct_1layer_flushed` is the same at the one-layer flushed time."""
    kv_bytes = 2 * batch * ctx * num_kv_heads * head_dim * itemsize
    gbs = kv_bytes / (ms * 1e-3) / 1e9
    return {
        "kv_read_gbs": gbs,
        "copy_gbs": copy_gbs,
        "pct_of_copy": 100.0 * gbs / copy_gbs,
        "pct_1layer_flushed": 100.0 * ms / ms_1layer_flushed * gbs / copy_gbs,
    }


def causal_prefill_flops(num_seqs: int, seq_len: int, num_heads: int, head_dim: int) -> float:
    """FLOPs of causal attention over `num_seqs` sequences of `seq_len` tokens: QK^T and PV, 2 FLOPs a
    multiply-add, over the seq_len (seq_len + 1) / 2 (query, key) pairs a causal mask keeps."""
    return 4 * num_seqs * num_heads * head_dim * seq_len * (seq_len + 1) / 2


def prefill_figures(flops: float, ms: float, ms_sdpa: float) -> dict[str, float]:
    """A prefill row's rate and its speed against SDPA flash (> 1: faster than SDPA)."""
    return {"tflops": flops / (ms * 1e-3) / 1e12, "vs_sdpa": ms_sdpa / ms}


def _paged_cache(
    batch: int,
    ctx: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    layers: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A block-major cache [blocks, layers, 2, block_size, Hkv, D] holding `batch` sequences of `ctx` tokens
    in shuffled blocks; returns it, layer 0's K and V, and the block tables."""
    device = gen.device
    blocks_per_seq = math.ceil(ctx / block_size)
    num_blocks = batch * blocks_per_seq
    kv = torch.empty((num_blocks, layers, 2, block_size, num_kv_heads, head_dim), dtype=dtype, device=device)
    kv.normal_(generator=gen)
    perm = torch.randperm(num_blocks, generator=gen, device=device)
    block_tables = perm.view(batch, blocks_per_seq).to(torch.int32)
    return kv, kv[:, 0, 0], kv[:, 0, 1], block_tables


def _bench_decode(
    name: str, num_heads: int, num_kv_heads: int, head_dim: int, copy_gbs: float, gen: torch.Generator
) -> dict[str, Any]:
    from roseinfer.kernels.paged_decode_attention import paged_decode_attention
    from roseinfer.kernels.paged_decode_split import choose_num_splits

    batch, ctx, block_size, dtype = 64, 4096, 16, torch.bfloat16
    device = gen.device
    kv, _, _, block_tables = _paged_cache(
        batch, ctx, block_size, num_kv_heads, head_dim, dtype, gen, layers=DECODE_LAYERS
    )
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    q = torch.empty((batch, num_heads, head_dim), dtype=dtype, device=device).normal_(generator=gen)
    out = torch.empty_like(q)
    splits = choose_num_splits(batch, num_kv_heads, ctx, device)
    scale = head_dim**-0.5

    def layer(i: int) -> None:
        k_cache, v_cache = kv[:, i, 0], kv[:, i, 1]
        paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, out=out, num_splits=splits)

    def every_layer() -> None:
        for i in range(DECODE_LAYERS):
            layer(i)

    ms = _graph_back_to_back_ms(every_layer, DECODE_LAYERS)
    ms_1layer_flushed = _graph_median_ms(lambda: layer(0))
    ms_eager = _median_ms(lambda: layer(0))
    return {
        "kernel": "paged_decode",
        "model": name,
        "shape": f"B={batch} ctx={ctx} Hq={num_heads} Hkv={num_kv_heads} D={head_dim} bs={block_size} splits={splits}",
        "ms": ms,
        "ms_1layer_flushed": ms_1layer_flushed,
        "ms_eager": ms_eager,
        **decode_figures(batch, ctx, num_kv_heads, head_dim, dtype.itemsize, ms, ms_1layer_flushed, copy_gbs),
    }


def _bench_prefill(gen: torch.Generator) -> list[dict[str, Any]]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from roseinfer.kernels.kv_store import store_kv
    from roseinfer.kernels.paged_prefill_attention import paged_prefill_attention

    num_seqs, seq_len, num_heads, num_kv_heads, head_dim, block_size = 4, 2048, 32, 8, 128, 16
    dtype, device = torch.bfloat16, gen.device
    tokens = num_seqs * seq_len
    q = torch.empty((tokens, num_heads, head_dim), dtype=dtype, device=device).normal_(generator=gen)
    k = torch.empty((tokens, num_kv_heads, head_dim), dtype=dtype, device=device).normal_(generator=gen)
    v = torch.empty_like(k).normal_(generator=gen)
    scale = head_dim**-0.5

    # Ours: K/V stored in a paged cache through (shuffled) block tables.
    _, k_cache, v_cache, block_tables = _paged_cache(
        num_seqs, seq_len, block_size, num_kv_heads, head_dim, dtype, gen
    )
    pos = torch.arange(seq_len, device=device)
    slots = (block_tables.long()[:, pos // block_size] * block_size + pos % block_size).reshape(-1)
    store_kv(k, v, k_cache, v_cache, slots)
    query_start_loc = torch.arange(0, tokens + 1, seq_len, dtype=torch.int32, device=device)
    seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=device)
    out = torch.empty_like(q)

    def ours() -> None:
        paged_prefill_attention(
            q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, seq_len, scale, out=out
        )

    # SDPA flash on [B, H, S, D]; K/V expanded to all query heads ahead of time (not timed).
    qs = q.view(num_seqs, seq_len, num_heads, head_dim).transpose(1, 2)
    group = num_heads // num_kv_heads
    ks = k.view(num_seqs, seq_len, num_kv_heads, head_dim).repeat_interleave(group, 2).transpose(1, 2)
    vs = v.view(num_seqs, seq_len, num_kv_heads, head_dim).repeat_interleave(group, 2).transpose(1, 2)
    ref: dict[str, torch.Tensor] = {}

    def sdpa() -> None:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref["out"] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)

    ours()
    sdpa()
    torch.cuda.synchronize()
    ref_out = ref["out"].transpose(1, 2).reshape(tokens, num_heads, head_dim)
    max_err = (out.float() - ref_out.float()).abs().max().item()
    flops = causal_prefill_flops(num_seqs, seq_len, num_heads, head_dim)
    shape = f"{num_seqs}x{seq_len} Hq={num_heads} Hkv={num_kv_heads} D={head_dim} causal"
    rows = []
    ms_sdpa = _median_ms(sdpa)
    ms_ours = _median_ms(ours)
    for kernel, ms in (("paged_prefill", ms_ours), ("sdpa_flash", ms_sdpa)):
        rows.append(
            {
                "kernel": kernel,
                "model": "llama-3.1-8b",
                "shape": shape + (f" bs={block_size}" if kernel == "paged_prefill" else ""),
                "ms": ms,
                **prefill_figures(flops, ms, ms_sdpa),
                "max_abs_err_vs_sdpa": max_err,
            }
        )
    return rows


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_rows(rows: list[dict[str, Any]]) -> None:
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    table = [[_fmt(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in table:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))


# The kernel targets: decode attention reads KV at >= 80% of copy bandwidth (b=64, ctx 4k); prefill
# attention takes at most 1.25x SDPA flash's time.
DECODE_MIN_PCT_OF_COPY = 80.0
PREFILL_MAX_X_SDPA = 1.25


def target_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per row that a kernel target applies to: the figure, the target and whether it is met."""
    lines = []
    for row in rows:
        if row["kernel"] == "paged_decode":
            pct = row["pct_of_copy"]
            verdict = "met" if pct >= DECODE_MIN_PCT_OF_COPY else "MISSED"
            lines.append(
                f"target: decode attention {row['model']} reads KV at {pct:.1f}% of copy bandwidth"
                f" (>= {DECODE_MIN_PCT_OF_COPY:.0f}%): {verdict}"
            )
        elif (
            row["kernel"] == "paged_prefill" and "vs_sdpa" in row
        ):  # fresh prompts; long-prefix rows have none
            x_sdpa = 1 / row["vs_sdpa"]
            verdict = "met" if x_sdpa <= PREFILL_MAX_X_SDPA else "MISSED"
            lines.append(
                f"target: prefill attention takes {x_sdpa:.2f}x SDPA flash's time"
                f" (<= {PREFILL_MAX_X_SDPA}x): {verdict}"
            )
    return lines


def run_kernel_bench(seed: int = 0, verbose: bool = True, long_prefix: bool = False) -> list[dict[str, Any]]:
    """Time decode and prefill attention on the current CUDA device; returns one dict per row. `long_prefix` adds
    a chunk over a long paged prefix beside SDPA flash and vLLM's FA3 (`kernels_prefix`)."""
    if not torch.cuda.is_available():
        raise RuntimeError("run_kernel_bench needs a CUDA GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device).manual_seed(seed)
    copy_gbs, copy_ms = _copy_bandwidth_gbs(device)
    rows: list[dict[str, Any]] = [
        {
            "kernel": "d2d_copy",
            "model": "-",
            "shape": "1 GiB bf16, bytes read + written",
            "ms": copy_ms,
            "copy_gbs": copy_gbs,
        }
    ]
    for name, num_heads, num_kv_heads, head_dim in DECODE_MODELS:
        rows.append(_bench_decode(name, num_heads, num_kv_heads, head_dim, copy_gbs, gen))
        torch.cuda.empty_cache()
    rows += _bench_prefill(gen)
    if long_prefix:
        from roseinfer.bench.kernels_prefix import run_prefix_chunk_bench

        rows += run_prefix_chunk_bench(gen, _median_ms)
    if verbose:
        print(f"device: {torch.cuda.get_device_name(device)}")
        print_rows(rows)
        print("\n".join(target_lines(rows)))
    return rows


def add_arguments(parser: Any) -> None:
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--long-prefix",
        action="store_true",
        help="also a 1024-token chunk over 4k and 9k paged prefixes (W7's prefill), beside SDPA flash and, where "
        "vLLM imports, its FlashAttention 3",
    )


def run(args: Any) -> int:
    from roseinfer.bench.env import bench_header, format_header

    if not torch.cuda.is_available():
        raise SystemExit("bench kernels needs a CUDA GPU")
    print(format_header(bench_header("kernels", "attention layers of qwen2.5-0.5b and llama-3.1-8b")))
    run_kernel_bench(args.seed, long_prefix=args.long_prefix)
    return 0
