"""Host cost of the Triton launches an eager step makes a layer at a time, through `DirectLaunch` and through
Triton's per-call argument binding.

For decode and prefill attention, rotary with the KV store, RMSNorm (with and without the residual), SiLU-and-mul
and q/k norm, at llama-3.1-8b's widths (qwen3-0.6b's for q/k norm), host microseconds per call of:
- the roseinfer wrapper as it launches (checks, allocations, argument list, `DirectLaunch.run`);
- the same wrapper launching through `kernel[grid](...)`, as every launch did before `DirectLaunch.run`;
- `kernel[grid](...)` with the wrapper's arguments already built (Triton binds and specialises them, looks up
  the compiled variant, launches);
- `DirectLaunch.run` with the arguments already built (the key, then the compiled launcher).
The GPU is kept busy by a queued sleep, so each call's time is the host's alone. GPU only.

    python scripts/probe_triton_launch.py [--calls 400]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from types import ModuleType

import torch

import roseinfer.kernels.activation as activation_mod
import roseinfer.kernels.paged_decode_attention as decode_mod
import roseinfer.kernels.paged_prefill_attention as prefill_mod
import roseinfer.kernels.qk_norm as qk_norm_mod
import roseinfer.kernels.rmsnorm as rmsnorm_mod
import roseinfer.kernels.rotary as rotary_mod
from roseinfer.kernels import paged_prefill_ws
from roseinfer.kernels.direct_launch import DirectLaunch


def host_us(fn: Callable[[], object], calls: int) -> float:
    """Median host time of `fn()` over `calls` calls, queued behind a sleep that outlasts them."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # ~1 s of GPU cycles
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2] * 1e6


class Captured(DirectLaunch):
    """Stands in for a module's launcher: keeps the last launch's grid and arguments, then launches it."""

    def run(self, grid, args, constexprs) -> None:
        self.call = (tuple(grid), tuple(args), dict(constexprs))
        super().run(grid, args, constexprs)


class ThroughTriton(DirectLaunch):
    """Stands in for a module's launcher: every launch through Triton's binding."""

    def run(self, grid, args, constexprs) -> None:
        self.kernel[tuple(grid)](*args, **constexprs)


def rows(module: ModuleType, wrapper: Callable[[], object], calls: int) -> list[float]:
    launcher = module.launcher
    captured = Captured(launcher.kernel)
    module.launcher = captured
    try:
        wrapper()
        grid, args, constexprs = captured.call
        module.launcher = ThroughTriton(launcher.kernel)
        through_triton = host_us(wrapper, calls)
    finally:
        module.launcher = launcher
    kernel = launcher.kernel
    return [
        host_us(wrapper, calls),
        through_triton,
        host_us(lambda: kernel[grid](*args, **constexprs), calls),
        host_us(lambda: launcher.run(grid, args, constexprs), calls),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    paged_prefill_ws.ENABLED = (
        False  # the Triton prefill kernel (the WS launch: probe_prefill_launch_host.py)
    )
    dev = torch.device("cuda")
    bf16 = dict(dtype=torch.bfloat16, device=dev)
    heads, kv_heads, dim, block, tokens = 32, 8, 128, 16, 512
    k_cache = torch.randn(400, block, kv_heads, dim, **bf16)
    v_cache = torch.randn_like(k_cache)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, **bf16)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].view(tokens, kv_heads, dim)
    table = torch.arange(160, dtype=torch.int32, device=dev)[None]
    context = torch.full((1,), 2048 + tokens, dtype=torch.int32, device=dev)
    starts = torch.tensor([0, tokens], dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    positions = torch.arange(tokens, device=dev)
    cos_sin = torch.zeros(tokens + 1, dim, dtype=torch.float32, device=dev)
    slots = torch.arange(tokens, device=dev)
    x = torch.randn(tokens, 4096, **bf16)
    residual = torch.randn_like(x)
    w = torch.randn(4096, **bf16)
    gate_up = torch.randn(tokens, 2 * 14336, **bf16)
    qwen3_qkv = torch.randn(tokens, (16 + 2 * 8) * 128, **bf16)
    norm_w = torch.ones(128, **bf16)
    decode_q = torch.randn(64, heads, dim, **bf16)
    decode_lens = torch.full((64,), 1024, dtype=torch.int32, device=dev)
    decode_tables = torch.arange(64, dtype=torch.int32, device=dev)[None].expand(64, -1).contiguous()
    decode_out = torch.empty_like(decode_q)

    cases = {
        "decode attention": (
            decode_mod,
            lambda: decode_mod.paged_decode_attention(
                decode_q, k_cache, v_cache, decode_tables, decode_lens, 0.1, out=decode_out, num_splits=2
            ),
        ),
        "prefill attention": (
            prefill_mod,
            lambda: prefill_mod.paged_prefill_attention(
                q, k_cache, v_cache, table, starts, context, tokens, 0.1, out=out
            ),
        ),
        "rotary + KV store": (
            rotary_mod,
            lambda: rotary_mod.apply_rotary_and_store_kv(
                q, k, v, positions, cos_sin, k_cache, v_cache, slots
            ),
        ),
        "rmsnorm": (rmsnorm_mod, lambda: rmsnorm_mod.rmsnorm(x, w, 1e-5)),
        "rmsnorm + residual": (rmsnorm_mod, lambda: rmsnorm_mod.rmsnorm(x, w, 1e-5, residual=residual)),
        "silu_and_mul": (activation_mod, lambda: activation_mod.silu_and_mul(gate_up)),
        "q/k norm": (qk_norm_mod, lambda: qk_norm_mod.qk_norm_(qwen3_qkv, 16, 8, 128, norm_w, norm_w, 1e-6)),
    }
    print(f"host us per call (median of {args.calls}, GPU busy), {tokens} tokens, llama-3.1-8b widths")
    print(f"{'kernel':20s}{'wrapper':>9s}{'via Triton':>12s}{'kernel[grid]':>14s}{'run':>8s}")
    totals = [0.0] * 4
    for name, (module, wrapper) in cases.items():
        measured = rows(module, wrapper, args.calls)
        totals = [t + m for t, m in zip(totals, measured, strict=True)]
        print(f"{name:20s}" + "".join(f"{m:{w}.1f}" for m, w in zip(measured, (9, 12, 14, 8), strict=True)))
    print(
        f"{'all of the above':20s}"
        + "".join(f"{m:{w}.1f}" for m, w in zip(totals, (9, 12, 14, 8), strict=True))
    )
    linear_w = torch.randn(4096, 4096, **bf16)
    print(f"{'torch linear':20s}{host_us(lambda: torch.nn.functional.linear(x, linear_w), args.calls):9.1f}")


if __name__ == "__main__":
    main()
