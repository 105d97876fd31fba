"""Paged decode attention as the decode graphs run it (the step's token appended, rotary in the kernel):
graph-replay time per tile config (BLOCK_N, warps, stages) and split count, for qwen2.5-0.5b, qwen3-0.6b
and llama-3.1-8b heads at batch 64 and W1/W2-like contexts (GPU only), with the rows served in their order and
longest first (`decode_order`, the engine's order). `--spread` draws unequal contexts, as W2's batches have.

Each replay runs eight layers of one block-major cache, so K/V come from HBM as in a model, not from the
L2 a one-layer benchmark would keep them in. `graph` marks the split count a decode graph captured for a
32k-token model length picks. `--kv-cache-dtype fp8` sweeps an fp8 cache, with `--fp8-dots` the dots' operand
types to compare (`_common.attention_dot_dtype`). Prints every case, then the three fastest per shape and
context."""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass

import torch

import roseinfer.kernels.paged_decode_attention as pda
import roseinfer.kernels.paged_decode_split as launch
from roseinfer.bench.kernels import _median_ms
from roseinfer.kernels.decode_new_token import NewTokenKV
from roseinfer.kernels.paged_decode_split import choose_num_splits, decode_order
from roseinfer.kv.cache_dtype import KV_CACHE_DTYPES, resolve_kv_cache_dtype

LAYERS = 8
BATCH = 64
SHAPES = {"qwen2.5-0.5b": (14, 2, 64), "qwen3-0.6b": (16, 8, 128), "llama-3.1-8b": (32, 8, 128)}
CONTEXTS = (576, 1024, 4096)
SPLITS = (1, 2, 3, 4, 6, 8)
# The rows' order: as given, or longest first (`decode_order`, as the engine launches them).
ORDERS = ("rows", "longest-first")


def graph_ms(fn) -> float:
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _median_ms(graph.replay)


@dataclass
class DecodeCase:
    """A batch of BATCH sequences of `ctx` tokens in LAYERS layers of one block-major cache (shuffled
    blocks, of 16 tokens unless `--block-size` says otherwise), with the step's new token (slots, rotary)
    as the decode graphs pass it."""

    kv: torch.Tensor  # [blocks, LAYERS, 2, 16, Hkv, D]
    tables: torch.Tensor
    seq_lens: torch.Tensor
    q: torch.Tensor
    new_kv: NewTokenKV
    out: torch.Tensor
    order: torch.Tensor | None = None

    def attend(self, splits: int, new_kv: NewTokenKV | None, layers: int = LAYERS) -> None:
        """The first `layers` layers' decode attention (all of them: as one step of a model runs it)."""
        d = self.q.shape[-1]
        for layer in range(layers):
            pda.paged_decode_attention(
                self.q,
                self.kv[:, layer, 0],
                self.kv[:, layer, 1],
                self.tables,
                self.seq_lens,
                d**-0.5,
                out=self.out,
                num_splits=splits,
                new_kv=new_kv,
                order=self.order,
            )


def decode_case(
    hq: int,
    hkv: int,
    d: int,
    ctx: int,
    gen: torch.Generator,
    spread: float = 0.0,
    block_size: int = 16,
    kv_dtype: torch.dtype = torch.bfloat16,
) -> DecodeCase:
    """`spread` > 0 draws each sequence's length uniformly from ctx * [1 - spread, 1 + spread] (a W2-like
    batch of mixed contexts); 0 gives every sequence `ctx` keys."""
    device = gen.device
    per_seq = -(-int(ctx * (1 + spread)) // block_size)
    kv = torch.empty((BATCH * per_seq, LAYERS, 2, block_size, hkv, d), dtype=torch.bfloat16, device=device)
    kv.normal_(generator=gen)
    kv = kv.to(kv_dtype)
    tables = torch.randperm(BATCH * per_seq, generator=gen, device=device).view(BATCH, per_seq).int()
    lo, hi = int(ctx * (1 - spread)), int(ctx * (1 + spread))
    seq_lens = torch.randint(max(lo, 1), hi + 1, (BATCH,), generator=gen, device=device).int()
    last = (seq_lens - 1).long()
    slots = (tables.gather(1, (last // block_size)[:, None])[:, 0] * block_size + last % block_size).int()
    positions = last.int()
    cos_sin = torch.rand((hi, d), generator=gen, device=device)
    q = torch.randn(BATCH, hq, d, dtype=torch.bfloat16, device=device, generator=gen)
    k_new = torch.randn(BATCH, hkv, d, dtype=torch.bfloat16, device=device, generator=gen)
    new_kv = NewTokenKV(k_new, torch.randn_like(k_new), slots, (positions, cos_sin))
    return DecodeCase(kv, tables, seq_lens, q, new_kv, torch.empty_like(q))


def sweep_case(
    name: str,
    hq: int,
    hkv: int,
    d: int,
    ctx: int,
    configs: list[tuple[int, int, int]],
    splits_list: list[int],
    gen: torch.Generator,
    spread: float = 0.0,
    block_size: int = 16,
    kv_dtype: torch.dtype = torch.bfloat16,
    dots: tuple[torch.dtype | None, ...] = (None,),
) -> list[tuple]:
    case = decode_case(hq, hkv, d, ctx, gen, spread, block_size, kv_dtype)
    device = gen.device
    kv_bytes = 2 * int(case.seq_lens.sum()) * hkv * d * case.kv.element_size()
    in_graph = choose_num_splits(BATCH, hkv, 32768, device)
    default_config, default_dot = launch.decode_config, pda.attention_dot_dtype
    now = default_config(d, torch.bfloat16, kv_dtype), default_dot(torch.bfloat16, kv_dtype)

    def run(splits: int) -> None:
        case.attend(splits, case.new_kv)

    rows = []
    longest_first = torch.from_numpy(decode_order(case.seq_lens.cpu().numpy())).to(device)
    for config, splits, order, dot in itertools.product(configs, splits_list, ORDERS, dots):
        case.order = longest_first if order == "longest-first" else None
        launch.decode_config = lambda *_, c=config: c
        dot_now = dot or now[1]
        pda.attention_dot_dtype = lambda *_, t=dot_now: t
        label = f"{config} splits {splits} {order}" + (
            f" dots {str(dot_now).removeprefix('torch.')}" if dot else ""
        )
        try:
            ms = graph_ms(lambda s=splits: run(s)) / LAYERS
        except Exception as exc:  # a config whose tiles do not fit the SM
            print(f"{name} ctx {ctx} {label}: {type(exc).__name__}")
            continue
        finally:
            launch.decode_config, pda.attention_dot_dtype = default_config, default_dot
        current = (config, dot_now) == now and order == ORDERS[1]
        engine = (("graph", splits == in_graph), ("current", current))
        mark = " ".join(m for m, on in engine if on)
        rows.append((name, ctx, label, ms * 1e3, kv_bytes / ms / 1e6, mark))
        print(f"{name} ctx {ctx} cfg {rows[-1][2]}: {ms * 1e3:.2f} us {rows[-1][4]:.0f} GB/s {mark}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help="comma-separated, of: " + ", ".join(SHAPES)
    )
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    parser.add_argument("--splits", default=",".join(map(str, SPLITS)))
    parser.add_argument(
        "--spread",
        type=float,
        default=0.0,
        help="draw each sequence's length from ctx * [1 - s, 1 + s] (0: all equal)",
    )
    parser.add_argument("--block-size", type=int, default=16, help="the KV cache's block size (tokens)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=sorted(KV_CACHE_DTYPES))
    parser.add_argument(
        "--fp8-dots", default="", help="with an fp8 cache: the dots' operand types to sweep (bf16,fp16)"
    )
    parser.add_argument("--block-n", default="32,64,128")
    parser.add_argument("--warps", default="2,4")
    # The kernel reads a tile's block-table entries a tile ahead: at 2 stages Triton keeps one K/V tile in
    # flight, from 3 on two (and fewer programs an SM).
    parser.add_argument("--stages", default="2,3,4")
    args = parser.parse_args()
    globals()["BATCH"] = args.batch  # decode_case and sweep_case read it
    ints = [[int(v) for v in a.split(",")] for a in (args.block_n, args.warps, args.stages)]
    configs = list(itertools.product(*ints))  # (BLOCK_N, num_warps, num_stages)
    shapes = {n: SHAPES[n] for n in args.shapes.split(",")}
    contexts = [int(c) for c in args.contexts.split(",")]
    splits_list = [int(c) for c in args.splits.split(",")]
    kv_dtype = resolve_kv_cache_dtype(args.kv_cache_dtype, torch.bfloat16)
    named = {"bf16": torch.bfloat16, "fp16": torch.float16}
    dots = tuple(named[n] for n in args.fp8_dots.split(",") if n) or (None,)
    gen = torch.Generator(device=torch.device("cuda")).manual_seed(0)
    rows = []
    for (name, (hq, hkv, d)), ctx in itertools.product(shapes.items(), contexts):
        rows += sweep_case(
            name, hq, hkv, d, ctx, configs, splits_list, gen, args.spread, args.block_size, kv_dtype, dots
        )
    print(
        "\nfastest per shape and context (BLOCK_N, warps, stages), and the current config at the graph split:"
    )
    for name, ctx in itertools.product(shapes, contexts):
        mine = sorted((r for r in rows if r[0] == name and r[1] == ctx), key=lambda r: r[3])
        for r in mine[:3] + [r for r in mine if r[5] == "graph current"]:
            print(f"  {name:13} ctx {ctx:5} cfg {r[2]}: {r[3]:7.2f} us {r[4]:6.0f} GB/s {r[5]}")


if __name__ == "__main__":
    main()
