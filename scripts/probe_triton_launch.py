"""Host cost of one Triton launch, and how much of it is Triton's per-call argument binding.

For the decode attention kernel (~40 arguments) and RMSNorm (~12), host microseconds per call of:
- the roseinfer wrapper (checks, allocations, argument list, launch);
- `kernel[grid](...)` with the wrapper's arguments already built (Triton binds and specialises them,
  looks up the compiled variant, launches);
- the compiled kernel's own launcher with the bound arguments reused: what a launch path that skips
  per-call binding would cost.
Kernels are tiny (batch 1, 16 tokens), so the host, not the GPU, sets the pace. GPU only.

    python scripts/probe_triton_launch.py [--calls 400]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from triton import knobs
from triton.runtime import driver

import roseinfer.kernels.paged_decode_attention as decode_mod
import roseinfer.kernels.rmsnorm as rmsnorm_mod


def host_us(fn: Callable[[], object], calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host / calls * 1e6


class Recorder:
    """Stands in for a module's @triton.jit kernel to catch the grid and arguments its wrapper builds."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.call: tuple | None = None

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.call = (grid, args, kwargs)

        return record


def capture(module, name: str, wrapper: Callable[[], object]) -> tuple:
    kernel = getattr(module, name)
    recorder = Recorder(kernel)
    setattr(module, name, recorder)
    try:
        wrapper()
    finally:
        setattr(module, name, kernel)
    assert recorder.call is not None
    return (kernel, *recorder.call)


def direct_launcher(kernel, grid, args, kwargs) -> Callable[[], object]:
    """The compiled variant's launcher, called with arguments bound once (as JITFunction.run does)."""
    kwargs = dict(kwargs, debug=kernel.debug or knobs.runtime.debug)
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    compiled = kernel[grid](*args, **kwargs)
    device = driver.active.get_current_device()
    stream = driver.active.get_current_stream(device)
    binder = kernel.device_caches[device][4]
    values = tuple(binder(*args, **kwargs)[0].values())
    g = tuple(grid) + (1,) * (3 - len(grid))

    def launch() -> None:
        meta = compiled.launch_metadata(grid, stream, *values)
        compiled.run(*g, stream, compiled.function, compiled.packed_metadata, meta, None, None, *values)

    return launch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    dev = torch.device("cuda")
    bf16 = dict(dtype=torch.bfloat16, device=dev)
    heads, kv_heads, dim, block = 32, 8, 128, 16
    k_cache = torch.randn(64, block, kv_heads, dim, **bf16)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(1, heads, dim, **bf16)
    table = torch.arange(4, dtype=torch.int32, device=dev)[None]
    seq_lens = torch.full((1,), 16, dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    x = torch.randn(8, 4096, **bf16)
    w = torch.randn(4096, **bf16)

    cases = {
        "decode attention": (
            decode_mod,
            "_decode_kernel",
            lambda: decode_mod.paged_decode_attention(
                q, k_cache, v_cache, table, seq_lens, 0.1, out=out, num_splits=1
            ),
        ),
        "rmsnorm": (rmsnorm_mod, "_rmsnorm_kernel", lambda: rmsnorm_mod.rmsnorm(x, w, 1e-5)),
    }
    print(f"{'kernel':18s}{'wrapper':>10s}{'kernel[grid]':>14s}{'launcher':>10s}  us of host per call")
    for name, (module, attr, wrapper) in cases.items():
        kernel, grid, kargs, kkwargs = capture(module, attr, wrapper)
        jit_call = lambda k=kernel, g=grid, a=kargs, kw=kkwargs: k[g](*a, **kw)  # noqa: E731
        launcher = direct_launcher(kernel, grid, kargs, kkwargs)
        wrapped, jitted, direct = (host_us(f, args.calls) for f in (wrapper, jit_call, launcher))
        print(f"{name:18s}{wrapped:10.1f}{jitted:14.1f}{direct:10.1f}")
    linear_w = torch.randn(4096, 4096, **bf16)
    print(f"{'torch linear':18s}{host_us(lambda: torch.nn.functional.linear(x, linear_w), args.calls):10.1f}")


if __name__ == "__main__":
    main()
