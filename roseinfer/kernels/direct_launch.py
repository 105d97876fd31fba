"""Launches of a compiled Triton (or Gluon) kernel that skip Triton's per-call argument binding.

`kernel[grid](...)` binds and specialises every argument on every call, then looks its variant up: ~35-40 us of
host for a launch of ~40 arguments (PERFORMANCE.md, "What a launch costs the host"), more where an argument is a
tensor descriptor. Eager steps pay that per kernel per layer. A `DirectLaunch` pays it once per key: the first
call with a key goes through `kernel[grid]`, which compiles or finds the variant, and later calls with that key
hand the variant's own launcher the arguments as they are.

The caller's key must fix everything Triton specialises a variant on: the tensors' dtypes and whether their data
pointers are 16-byte aligned, the constexprs, and the values of the integer arguments not marked
do_not_specialize (Triton specialises on 1 and on divisibility by 16), and that every integer fits in 32 bits.
Triton's debug and instrumentation knobs, and the kernel's globals, are read on a key's first launch only.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from triton import knobs
from triton.runtime import driver

from roseinfer.kernels._common import is_interpret

I32_MAX = 2**31 - 1


def variant_key(tensors: Sequence[Any], ints: Sequence[int], unspecialised: Sequence[int] = ()) -> tuple:
    """What Triton specialises a launch's variant on, of these arguments: the tensors' dtypes and 16-byte
    alignment, the specialised integers' values, and whether every integer fits in 32 bits."""
    return (
        *(t.dtype for t in tensors),
        *(t.data_ptr() % 16 == 0 for t in tensors),
        *ints,
        max(0, *ints, *unspecialised) <= I32_MAX,
    )


def _hooked() -> bool:
    """Whether a launch hook is set (a profiler's), which the direct path would not call. Triton 3.6 keeps them
    in a HookChain, there and empty when none is set."""
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return any(hook is not None and getattr(hook, "calls", True) for hook in hooks)


class DirectLaunch:
    """One kernel's launches by key. `launches` counts (through Triton, direct) for tests and probes."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.variants: dict[Hashable, Any] = {}
        self.launches = [0, 0]

    def __call__(
        self,
        key: Hashable,
        grid: Sequence[int],
        args: Sequence[Any],
        constexprs: dict[str, Any],
        jit_args: Callable[[], Sequence[Any]] | None = None,
    ) -> None:
        """Launch `kernel[grid](*args, **constexprs)`. `jit_args()` (default: `args`) gives what Triton binds on
        a key's first call, where `args` may hold lighter stand-ins: only what the compiled launcher reads of
        them, e.g. a tensor descriptor's base, shape, strides and padding without its constructor's checks."""
        # The interpreter compiles nothing (and has no driver): every call goes through it.
        device = None if is_interpret() else driver.active.get_current_device()
        variant = self.variants.get((device, key))
        if variant is None or _hooked():
            compiled = self.kernel[tuple(grid)](*(args if jit_args is None else jit_args()), **constexprs)
            self.launches[0] += 1
            if device is not None:
                self.variants[(device, key)] = compiled
            return
        values = [*args, *(constexprs[name] for name in self.kernel.arg_names[len(args) :])]
        g = (*grid, 1, 1)
        stream = driver.active.get_current_stream(device)
        variant.run(
            g[0], g[1], g[2], stream, variant.function, variant.packed_metadata, None, None, None, *values
        )
        self.launches[1] += 1

    def forget(self) -> None:
        """Drop every variant found so far (the next call per key goes through Triton again)."""
        self.variants.clear()
