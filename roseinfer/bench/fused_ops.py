"""The fused elementwise kernels against torch eager and torch.compile (GPU only).

The engine runs RMSNorm + residual add, SiLU-and-mul and rotary (q and k in place) as one Triton launch
each. For every model shape and row count (a decode batch, a prefill chunk) this times each op three ways
on the same inputs:
- the Triton kernel;
- its torch reference, eager (several launches);
- that reference under `torch.compile` (inductor fuses it into kernels of its own).
All three are CUDA-graph replays back to back, so Python's launch cost is out of the figures. The floor
is the op's bytes (read + written) over the device-to-device copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from roseinfer.bench.kernels import _graph_back_to_back_ms, print_rows
from roseinfer.config import ModelConfig
from roseinfer.kernels.activation import silu_and_mul, silu_and_mul_ref
from roseinfer.kernels.rmsnorm import rmsnorm, rmsnorm_ref
from roseinfer.kernels.rotary import apply_rotary, apply_rotary_ref
from roseinfer.models.loader import BUILTIN_CONFIG_DIR

SHAPES = ("qwen2.5-0.5b", "llama-3.1-8b")
ROWS = (64, 4096)  # W1's decode batch; a prefill chunk
LAUNCHES = 8  # of one op per graph, so that the per-op figure is not a graph launch's gap

Outputs = tuple[torch.Tensor, ...]


@dataclass
class FusedCase:
    """One op: fresh inputs, the Triton call and its torch reference (both return what the op wrote,
    in-place results included), and the bytes the op must read and write."""

    op: str
    nbytes: int
    inputs: Callable[[], tuple[Any, ...]]
    triton: Callable[..., Outputs]
    reference: Callable[..., Outputs]


def _rmsnorm_case(cfg: ModelConfig, rows: int, gen: torch.Generator) -> FusedCase:
    h, dev, eps = cfg.hidden_size, gen.device, cfg.norm_eps
    x = torch.randn(rows, h, dtype=torch.bfloat16, device=dev, generator=gen)
    residual = torch.randn(rows, h, dtype=torch.bfloat16, device=dev, generator=gen)
    w = torch.rand(h, dtype=torch.bfloat16, device=dev, generator=gen) + 0.5

    def triton_op(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> Outputs:
        return rmsnorm(x, w, eps, res), res

    def reference(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> Outputs:
        return rmsnorm_ref(x, w, eps, res), res

    # Reads x, the residual and w; writes the residual and the output.
    nbytes = (4 * rows * h + h) * 2
    return FusedCase("rmsnorm+residual", nbytes, lambda: (x, residual.clone(), w), triton_op, reference)


def _silu_case(cfg: ModelConfig, rows: int, gen: torch.Generator) -> FusedCase:
    inter = cfg.intermediate_size
    x = torch.randn(rows, 2 * inter, dtype=torch.bfloat16, device=gen.device, generator=gen)

    def triton_op(x: torch.Tensor) -> Outputs:
        return (silu_and_mul(x),)

    def reference(x: torch.Tensor) -> Outputs:
        return (silu_and_mul_ref(x),)

    return FusedCase("silu_and_mul", 3 * rows * inter * 2, lambda: (x,), triton_op, reference)


def _rotary_case(cfg: ModelConfig, rows: int, gen: torch.Generator) -> FusedCase:
    d, dev = cfg.head_dim, gen.device
    q = torch.randn(rows, cfg.num_heads, d, dtype=torch.bfloat16, device=dev, generator=gen)
    k = torch.randn(rows, cfg.num_kv_heads, d, dtype=torch.bfloat16, device=dev, generator=gen)
    max_pos = 8192
    positions = torch.randint(0, max_pos, (rows,), dtype=torch.int32, device=dev, generator=gen)
    cos_sin = torch.rand(max_pos, d, dtype=torch.float32, device=dev, generator=gen)

    def triton_op(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, cs: torch.Tensor) -> Outputs:
        apply_rotary(q, k, pos, cs)
        return q, k

    def reference(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, cs: torch.Tensor) -> Outputs:
        return apply_rotary_ref(q, k, pos, cs)

    # Reads and writes q and k; reads a float32 cos/sin row per token.
    nbytes = 2 * rows * (cfg.num_heads + cfg.num_kv_heads) * d * 2 + rows * d * 4
    inputs = lambda: (q.clone(), k.clone(), positions, cos_sin)  # noqa: E731
    return FusedCase("rotary q+k", nbytes, inputs, triton_op, reference)


CASES = (_rmsnorm_case, _silu_case, _rotary_case)


def _max_err(a: Outputs, b: Outputs) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b, strict=True))


def bench_case(case: FusedCase, copy_bytes_per_s: float) -> dict[str, Any]:
    compiled = torch.compile(case.reference, dynamic=False)
    ours = case.triton(*case.inputs())
    eager_out = case.reference(*case.inputs())
    compiled_out = compiled(*case.inputs())
    times = {}
    for name, fn in (("triton", case.triton), ("eager", case.reference), ("compiled", compiled)):
        args = case.inputs()
        times[name] = _graph_back_to_back_ms(lambda f=fn, a=args: [f(*a) for _ in range(LAUNCHES)], LAUNCHES)
    return {
        **fused_row(case.op, case.nbytes, copy_bytes_per_s, times),
        "err_triton": _max_err(ours, eager_out),
        "err_compiled": _max_err(compiled_out, eager_out),
    }


def fused_row(op: str, nbytes: int, copy_bytes_per_s: float, times: dict[str, float]) -> dict[str, Any]:
    """An op's row from its ms per launch by way (`triton`, `eager`, `compiled`): microseconds, the floor (its
    bytes at the copy bandwidth), Triton's time as a multiple of the floor, and the fastest way."""
    floor_ms = nbytes / copy_bytes_per_s * 1e3
    return {
        "op": op,
        "floor_us": floor_ms * 1e3,
        "triton_us": times["triton"] * 1e3,
        "eager_us": times["eager"] * 1e3,
        "compiled_us": times["compiled"] * 1e3,
        "triton_x_floor": times["triton"] / floor_ms,
        "compiled_vs_triton": times["compiled"] / times["triton"],
        "fastest": min(times, key=times.__getitem__),
    }


@torch.inference_mode()
def run_fused_bench(
    shapes: tuple[str, ...] = SHAPES, rows: tuple[int, ...] = ROWS, seed: int = 0, verbose: bool = True
) -> list[dict[str, Any]]:
    """One row per (shape, rows, op); see the module doc."""
    from roseinfer.bench.env import measure_copy_bandwidth

    if not torch.cuda.is_available():
        raise RuntimeError("the fused-op benchmark needs a CUDA GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device).manual_seed(seed)
    copy_bytes_per_s = measure_copy_bandwidth(device)
    if verbose:
        print(f"# measured copy bandwidth {copy_bytes_per_s / 1e12:.2f} TB/s", flush=True)
    results = []
    for shape in shapes:
        cfg = ModelConfig.from_path(os.path.join(BUILTIN_CONFIG_DIR, f"{shape}.json"))
        for n in rows:
            for make in CASES:
                row = {"model": shape, "rows": n, **bench_case(make(cfg, n, gen), copy_bytes_per_s)}
                results.append(row)
                if verbose:
                    print(
                        f"{shape} rows {n} {row['op']}: triton {row['triton_us']:.2f} us, eager "
                        f"{row['eager_us']:.2f}, compiled {row['compiled_us']:.2f}, floor {row['floor_us']:.2f}",
                        flush=True,
                    )
    if verbose:
        print()
        print_rows(results)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-shapes", default=",".join(SHAPES), help="comma-separated built-in shapes")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from roseinfer.bench.env import bench_header, format_header

    if not torch.cuda.is_available():
        raise SystemExit("bench fused needs a CUDA GPU")
    shapes = tuple(s for s in args.model_shapes.split(",") if s)
    header = bench_header("fused-ops", ",".join(shapes))
    print(format_header(header), flush=True)
    run_fused_bench(shapes, tuple(int(r) for r in args.rows.split(",")), args.seed)
    return 0
