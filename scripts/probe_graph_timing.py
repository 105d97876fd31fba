"""Why `bench kernels` timed qwen-like decode attention slower than `sweep_decode_config.py` (GPU only).

One kernel call (qwen2.5-0.5b heads, batch 64, ctx 4k, graph split count, no new token) timed five ways:
- `do_bench, 1 layer`: `bench kernels`' method before the eighth session: a one-launch graph under
  triton's do_bench, which zeroes a 256 MB buffer (the L2 flush) and records an event pair around every
  replay;
- `events, 1 layer`: the same graph, an event pair around every replay, no flush;
- `loop, 1 layer`: the same graph replayed back to back, one event pair around all replays;
- `do_bench, 8 layers`: eight layers of one block-major cache in one graph, per layer (the sweep's method);
- `loop, 8 layers x 4`: those eight layers four times in one graph, replayed back to back, per launch.
Plus `do_bench, empty`: a one-launch graph of a kernel that stores one value per program.
"""

from __future__ import annotations

import statistics

import torch
import triton
import triton.language as tl
from sweep_decode_config import BATCH, LAYERS, decode_case  # this folder is on sys.path

from roseinfer.bench.kernels import _graph_back_to_back_ms, _graph_median_ms, _median_ms
from roseinfer.kernels.paged_decode_split import choose_num_splits

HQ, HKV, D, CTX = 14, 2, 64, 4096


@triton.jit
def _store_one(out_ptr):
    tl.store(out_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), 1.0)


def capture(fn) -> torch.cuda.CUDAGraph:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def per_replay_events_ms(graph: torch.cuda.CUDAGraph, reps: int = 200) -> float:
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)
    ]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def main() -> None:
    gen = torch.Generator(device=torch.device("cuda")).manual_seed(0)
    case = decode_case(HQ, HKV, D, CTX, gen)
    splits = choose_num_splits(BATCH, HKV, CTX, gen.device)
    kv_bytes = 2 * BATCH * CTX * HKV * D * 2

    def one_layer() -> None:
        case.attend(splits, None, layers=1)

    def eight_layers(repeats: int = 1) -> None:
        for _ in range(repeats):
            case.attend(splits, None)

    flags = torch.empty(BATCH * HKV * splits, device=gen.device)

    def empty() -> None:
        _store_one[(BATCH * HKV, splits)](flags)

    rows = {
        "do_bench, 1 layer": _graph_median_ms(one_layer),
        "events, 1 layer": per_replay_events_ms(capture(one_layer)),
        "loop, 1 layer": _graph_back_to_back_ms(one_layer, 1, replays=200, rounds=1),
        "do_bench, 8 layers": _graph_median_ms(eight_layers) / LAYERS,
        "loop, 8 layers x 4": _graph_back_to_back_ms(
            lambda: eight_layers(4), 4 * LAYERS, replays=50, rounds=1
        ),
        "do_bench, empty": _graph_median_ms(empty),
        "loop, empty": _graph_back_to_back_ms(empty, 1, replays=200, rounds=1),
    }
    copy_src = torch.empty(1 << 29, dtype=torch.bfloat16, device=gen.device)
    copy_dst = torch.empty_like(copy_src)
    copy_tb_s = 2 * copy_src.nbytes / _median_ms(lambda: copy_dst.copy_(copy_src)) / 1e9
    print(f"qwen-like decode attention, B={BATCH} ctx={CTX} splits={splits}; copy {copy_tb_s:.2f} TB/s")
    print(f"{'method':22} {'us':>8} {'TB/s':>7} {'% copy':>7}")
    for name, ms in rows.items():
        tb_s = kv_bytes / ms / 1e9
        pct = "" if "empty" in name else f"{100 * tb_s / copy_tb_s:7.1f}"
        print(f"{name:22} {ms * 1e3:8.2f} {tb_s:7.2f} {pct:>7}")


if __name__ == "__main__":
    main()
