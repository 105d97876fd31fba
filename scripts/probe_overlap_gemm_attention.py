"""Can a compute-bound GEMM and a memory-bound decode attention share the GPU? (GPU only)

W2 on llama-3.1-8b spends most of its time in steps that hold a prefill chunk beside ~200 decodes: the chunk's
GEMMs are bound by the tensor cores, the decodes' attention by HBM, and the step runs them one after the other.
Its roofline floor adds the two (prefill FLOPs + decode bytes); a step that ran them at once could go under it.
This probe asks how much of that overlap the hardware gives before any engine change: one CUDA graph of LAYERS
llama layers' four GEMMs at M rows (weights from HBM), one of LAYERS layers of decode attention at B rows of
`ctx` keys, both back to back (serial) and both on two branches of one graph (concurrent). cuBLASLt can be
told to leave SMs to the other branch (`torch._C._set_sm_carveout_experimental`); `--carveouts` sweeps that.

overlap = (serial - concurrent) / min(gemm, attention): 1 is a perfect overlap, 0 none.

`--reader` asks the question for an ideal memory-bound kernel instead: a persistent Triton read of a large
buffer on exactly s programs (one an SM), first alone (how much of HBM's rate s SMs reach), then beside the
GEMMs told to leave those s SMs free.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import sweep_decode_config as sweep  # this folder is on sys.path
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from roseinfer.bench.kernels import _median_ms
from roseinfer.config import ModelConfig
from roseinfer.kernels.paged_decode_split import choose_num_splits
from roseinfer.models.loader import BUILTIN_CONFIG_DIR

LLAMA = ModelConfig.from_path(f"{BUILTIN_CONFIG_DIR}/llama-3.1-8b.json")
HQ, HKV, D = LLAMA.num_heads, LLAMA.num_kv_heads, LLAMA.head_dim
HIDDEN, INTERMEDIATE = LLAMA.hidden_size, LLAMA.intermediate_size
GEMMS = ((HQ + 2 * HKV) * D, HIDDEN), (HIDDEN, HQ * D), (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)


def capture(*branches: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """One graph: the first branch on the capture stream, each other one on a stream of its own, forked
    from and joined back into it, so that the branches may run at once."""
    for branch in branches:  # compile and warm outside the capture
        branch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = [torch.cuda.Stream() for _ in branches[1:]]
    with torch.cuda.graph(graph):
        main = torch.cuda.current_stream()
        for stream in side:
            stream.wait_stream(main)
        branches[0]()
        for stream, branch in zip(side, branches[1:], strict=True):
            with torch.cuda.stream(stream):
                branch()
        for stream in side:
            main.wait_stream(stream)
    return graph


@triton.jit
def _stream_read(x_ptr, out_ptr, n_tiles, TILE: tl.constexpr, PROGRAMS: tl.constexpr):
    """Each program sums every PROGRAMS-th tile: a pure HBM read on a fixed number of programs."""
    pid = tl.program_id(0)
    acc = tl.zeros([TILE], tl.float32)
    for t in range(pid, n_tiles, PROGRAMS):
        acc += tl.load(x_ptr + t * TILE + tl.arange(0, TILE)).to(tl.float32)
    tl.store(out_ptr + pid * TILE + tl.arange(0, TILE), acc)


def reader(buffer: torch.Tensor, programs: int, tile: int = 16384) -> Callable[[], None]:
    out = torch.empty(programs * tile, device=buffer.device)
    n_tiles = buffer.numel() // tile

    def run() -> None:
        _stream_read[(programs,)](buffer, out, n_tiles, TILE=tile, PROGRAMS=programs, num_warps=16)

    return run


def set_blas(carveout: str) -> None:
    """none: cuBLAS as the engine calls it; a number: cuBLASLt leaving that many SMs free (0: none)."""
    lt = carveout != "none"
    torch.backends.cuda.preferred_blas_library("cublaslt" if lt else "cublas")
    torch._C._set_sm_carveout_experimental(int(carveout) if lt and carveout != "0" else None)


def timed_us(*branches: Callable[[], None]) -> float:
    return _median_ms(capture(*branches).replay) * 1e3


def measure(gemms: Callable[[], None], other: Callable[[], None], carveout: str) -> tuple[float, ...]:
    """us of the GEMMs alone, the other kernel alone, both back to back and both at once, with the GEMMs on
    `carveout`'s BLAS (`set_blas`); then the overlap, (serial - concurrent) / min(gemm, other)."""
    set_blas(carveout)
    try:
        gemm_us, other_us = timed_us(gemms), timed_us(other)
        serial_us, conc_us = timed_us(serial(gemms, other)), timed_us(gemms, other)
    finally:
        set_blas("none")
    return gemm_us, other_us, serial_us, conc_us, (serial_us - conc_us) / min(gemm_us, other_us)


def row(labels: tuple[object, ...], measured: tuple[float, ...]) -> str:
    """A markdown table row: the labels, then `measure`'s us and its overlap."""
    *us, overlap = measured
    return "| " + " | ".join([*map(str, labels), *(f"{t:.0f}" for t in us), f"{overlap:.2f}"]) + " |"


def serial(*steps: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        for step in steps:
            step()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="256,512", help="the GEMMs' rows (a prefill chunk)")
    parser.add_argument("--batches", default="128,256", help="decode attention's rows")
    parser.add_argument("--ctx", type=int, default=800, help="keys per decode row")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument(
        "--carveouts",
        default="none,0,16,32,48,66",
        help="SMs the GEMMs leave free (none: cuBLAS as the engine calls it; numbers: cuBLASLt with that carveout)",
    )
    parser.add_argument(
        "--reader", action="store_true", help="an ideal memory-bound kernel instead of attention"
    )
    parser.add_argument("--reader-gb", type=float, default=2.0, help="bytes the reader reads a replay")
    args = parser.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    sweep.LAYERS = args.layers
    weights = [
        [torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * k**-0.5 for n, k in GEMMS]
        for _ in range(args.layers)
    ]
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    print(
        f"device {torch.cuda.get_device_name()} ({sms} SMs), llama-3.1-8b shapes, {args.layers} layers, ctx {args.ctx}"
    )
    if args.reader:
        return main_reader(args, weights, sms)
    print("| rows | batch | cuBLAS | gemm us | attention us | serial us | concurrent us | overlap |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for batch in map(int, args.batches.split(",")):
        sweep.BATCH = batch
        case = sweep.decode_case(HQ, HKV, D, args.ctx, gen)
        splits = choose_num_splits(batch, HKV, 32768, device)

        def attention(case=case, splits=splits) -> None:
            case.attend(splits, case.new_kv, args.layers)

        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, INTERMEDIATE, device=device, dtype=torch.bfloat16, generator=gen)

            gemms = gemm_chain(weights, x)
            for carveout in args.carveouts.split(","):
                label = "as the engine" if carveout == "none" else f"Lt, {carveout} SMs left"
                print(row((rows, batch, label), measure(gemms, attention, carveout)), flush=True)
        del case
        torch.cuda.empty_cache()


def gemm_chain(weights: list[list[torch.Tensor]], x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        for layer in weights:
            for w in layer:
                F.linear(x[:, : w.shape[1]], w)

    return run


def main_reader(args: argparse.Namespace, weights: list[list[torch.Tensor]], sms: int) -> None:
    device = weights[0][0].device
    buffer = torch.ones(int(args.reader_gb * 2**30) // 2, device=device, dtype=torch.bfloat16)
    gb = buffer.numel() * 2 / 1e9
    print("| reader programs | reader alone us | TB/s |")
    print("|---:|---:|---:|")
    for programs in (8, 16, 24, 32, 48, 66, 132, 264):
        us = timed_us(reader(buffer, programs))
        print(f"| {programs} | {us:.0f} | {gb / us * 1e3:.2f} |", flush=True)
    print("| rows | SMs left | gemm us | reader us | serial us | concurrent us | overlap |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rows in map(int, args.rows.split(",")):
        x = torch.randn(rows, INTERMEDIATE, device=device, dtype=torch.bfloat16)
        gemms = gemm_chain(weights, x)
        for carveout in ("16", "24", "32", "48"):
            print(row((rows, carveout), measure(gemms, reader(buffer, int(carveout)), carveout)), flush=True)
    print(f"(as the engine: gemm {timed_us(gemm_chain(weights, x)):.0f} us at {rows} rows, {sms} SMs)")


if __name__ == "__main__":
    main()
