"""Where paged decode attention's fixed cost goes (GPU only): qwen2.5-0.5b heads (14 q / 2 kv, D=64),
batch 64, graph replays of eight layers of one block-major cache, as `sweep_decode_config.py` times them.

Per variant and context it prints microseconds per layer, then a least-squares line over the contexts
>= 576: its intercept is the fixed cost of a launch (launch, dependent loads before the first K/V tile,
the split merge, the tail), its slope the marginal K/V bandwidth. Variants:
- engine: as the decode graphs run it (new token appended, rotary, deferred norm with bias), graph split;
- 1-split: the same with one split (no partials, no merge);
- plain: no new token, no rotary, no norm (every key from the cache), graph split;
- empty: a kernel with the same grid that only stores one value per program (launch and ramp alone).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import triton
import triton.language as tl
from sweep_decode_config import BATCH, LAYERS, decode_case, graph_ms  # this folder is on sys.path

import roseinfer.kernels.paged_decode_split as launch
from roseinfer.kernels.decode_new_token import DeferredNorm
from roseinfer.kernels.paged_decode_split import choose_num_splits

HQ, HKV, D, HIDDEN = 14, 2, 64, 896
CONTEXTS = (16, 576, 1024, 2048, 4096)
CONFIGS = ((128, 4, 3), (128, 4, 5), (64, 2, 5), (64, 4, 5))


@triton.jit
def _empty_kernel(out_ptr):
    pid = tl.program_id(0) * tl.num_programs(1) * tl.num_programs(2)
    pid += tl.program_id(1) * tl.num_programs(2) + tl.program_id(2)
    tl.store(out_ptr + pid, 1.0)


def graph_us(fn) -> float:
    return graph_ms(fn) * 1e3 / LAYERS


def case(ctx: int, gen: torch.Generator) -> dict[str, float]:
    device = gen.device
    inputs = decode_case(HQ, HKV, D, ctx, gen)
    x = torch.randn(BATCH, HIDDEN, dtype=torch.bfloat16, device=device, generator=gen)
    bias = torch.randn((HQ + 2 * HKV) * D, dtype=torch.bfloat16, device=device, generator=gen)
    engine_kv = dataclasses.replace(inputs.new_kv, norm=DeferredNorm(x, 1e-6, bias))
    flags = torch.empty(BATCH * HKV * 64, dtype=torch.float32, device=device)
    graph_splits = choose_num_splits(BATCH, HKV, 32768, device)
    attend = inputs.attend

    def empty() -> None:
        for _ in range(LAYERS):
            _empty_kernel[(BATCH, HKV, graph_splits)](flags)

    times = {"empty": graph_us(empty)}
    default_config = launch.decode_config
    try:
        for config in CONFIGS:
            launch.decode_config = lambda *_, c=config: c
            tag = "x".join(map(str, config))
            times[f"engine {tag}"] = graph_us(lambda: attend(graph_splits, engine_kv))
            times[f"1-split {tag}"] = graph_us(lambda: attend(1, engine_kv))
            times[f"plain {tag}"] = graph_us(lambda: attend(graph_splits, None))
            times[f"engine 6 splits {tag}"] = graph_us(lambda: attend(6, engine_kv))
    finally:
        launch.decode_config = default_config
    return times


def main() -> None:
    gen = torch.Generator(device=torch.device("cuda")).manual_seed(0)
    print(f"graph split count: {choose_num_splits(BATCH, HKV, 32768, gen.device)}")
    table = {ctx: case(ctx, gen) for ctx in CONTEXTS}
    variants = list(table[CONTEXTS[0]])
    print(f"{'variant':28}" + "".join(f"{c:>9}" for c in CONTEXTS) + "  intercept_us  marginal_TB/s  4k_TB/s")
    fit = [c for c in CONTEXTS if c >= 576]
    for v in variants:
        us = [table[c][v] for c in CONTEXTS]
        kv_mb = np.array([2 * BATCH * c * HKV * D * 2 / 1e6 for c in fit])
        slope, intercept = np.polyfit(kv_mb, [table[c][v] for c in fit], 1)
        tb_s = 1 / slope if slope > 0 else float("nan")  # MB per us = TB/s
        at_4k = 2 * BATCH * 4096 * HKV * D * 2 / 1e6 / table[4096][v]
        print(
            f"{v:28}" + "".join(f"{t:9.2f}" for t in us) + f"  {intercept:12.2f}  {tb_s:13.2f}  {at_4k:7.2f}"
        )


if __name__ == "__main__":
    main()
