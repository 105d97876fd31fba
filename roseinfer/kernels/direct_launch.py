"""Launches of a compiled Triton (or Gluon) kernel that skip Triton's per-call argument binding.

`kernel[grid](...)` binds and specialises every argument on every call, then looks its variant up: ~35-40 us of
host for a launch of ~40 arguments (PERFORMANCE.md, "What a launch costs the host"), more where an argument is a
tensor descriptor. Eager steps pay that per kernel per layer. A `DirectLaunch` pays it once per key: the first
call with a key goes through `kernel[grid]`, which compiles or finds the variant, and later calls with that key
hand the variant's own launcher the arguments as they are.

A key must fix everything Triton specialises a variant on: the tensors' dtypes and whether their data pointers
are 16-byte aligned, the constexprs and launch options, the integer arguments not marked do_not_specialize (Triton
specialises on 1 and on divisibility by 16), and every integer's width. `DirectLaunch.run` keys a launch by exactly
that (`arg_key`); the warp-specialised launch keys by the same rule (`variant_key`), its descriptors being stand-ins.
Triton's debug and instrumentation knobs, and the kernel's globals, are read on a key's first launch only.

A variant whose arguments include tensor descriptors has its launcher wrapped by Triton in one that encodes each
descriptor (`cuTensorMapEncodeTiled`) on every call: 6.5 of the 56 us the warp-specialised prefill launch cost the
host (H200, PERFORMANCE.md "Fifty-seventh session"). The direct path calls the launcher beneath that wrapper and
keeps each descriptor's encoding by what it encodes (base address, shape, strides, padding, the variant's box): a
layer's KV cache is encoded once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import torch
from triton import knobs
from triton.backends.nvidia.driver import make_tensordesc_arg
from triton.runtime import driver

from roseinfer.kernels._common import is_interpret

I32_MAX = 2**31 - 1
MAX_DESCRIPTORS = 4096  # encodings kept (the prefill kernel's: two a layer); past it, dropped and redone


def arg_key(arg: Any, specialised: bool = True) -> Hashable:
    """What Triton specialises a variant on, of one argument: a tensor's dtype and 16-byte alignment; an integer's
    width (32 bits, 64, unsigned 64) and, unless it is marked do_not_specialize, whether it is 1 and whether 16
    divides it; a float's type (fp32 whatever its value); anything else (None, a bool) itself."""
    kind = type(arg)
    if kind is int:
        wide = (arg > I32_MAX or arg < -I32_MAX - 1) + (arg > 2**63 - 1)
        return (wide, arg == 1, arg % 16 == 0) if specialised else wide
    if kind is float:
        return float
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    return arg


def variant_key(tensors: Sequence[Any], ints: Sequence[int], unspecialised: Sequence[int] = ()) -> tuple:
    """`arg_key` of each of these arguments: tensors, integers Triton specialises, integers marked
    do_not_specialize."""
    return (*map(arg_key, tensors), *map(arg_key, ints), *(arg_key(i, False) for i in unspecialised))


def _hooked() -> bool:
    """Whether a launch hook is set (a profiler's), which the direct path would not call. Triton 3.6 keeps them
    in a HookChain, there and empty when none is set."""
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return any(hook is not None and getattr(hook, "calls", True) for hook in hooks)


class Variant(NamedTuple):
    """A key's compiled variant; for one with tensor descriptors, the launcher beneath Triton's descriptor wrapper
    and each descriptor's (argument index, metadata)."""

    compiled: Any
    launch: Callable[..., Any] | None = None
    descriptors: tuple[tuple[int, Any], ...] = ()


def direct_variant(compiled: Any) -> Variant:
    """`compiled` as the direct path launches it: beneath Triton's descriptor wrapper (`wrap_handle_tensordesc`,
    a closure over the compiled `launcher`) where there is one and the variant needs no scratch memory (which
    Triton's launcher would allocate), else through its own launcher."""
    run = compiled.run
    wrapper = getattr(run, "launch", None)
    raw = inspect.getclosurevars(wrapper).nonlocals.get("launcher") if inspect.isfunction(wrapper) else None
    if raw is None or run.global_scratch_size or run.profile_scratch_size:
        return Variant(compiled)
    metas = getattr(compiled.metadata, "tensordesc_meta", None) or []
    signature = compiled.src.signature.values()
    indices = [i for i, sig in enumerate(signature) if isinstance(sig, str) and sig.startswith("tensordesc")]
    if not metas or len(indices) != len(metas):  # no encoding to keep (None: the frontend decomposes them)
        return Variant(compiled)
    return Variant(compiled, raw, tuple(zip(indices, metas, strict=True)))


class DirectLaunch:
    """One kernel's launches by key. `launches` counts (through Triton, direct) for tests and probes; `encodings`
    the tensor descriptors the direct path encoded."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.variants: dict[Hashable, Variant] = {}
        self.descriptors: dict[tuple, list[Any]] = {}
        self.launches = [0, 0]
        self.encodings = 0
        # Per parameter, whether Triton specialises it: not marked do_not_specialize, by name or position.
        marks = getattr(kernel, "do_not_specialize", None)
        if marks is None:  # the interpreter's kernels keep the marks among their jit keyword arguments
            marks = getattr(kernel, "kwargs", {}).get("do_not_specialize")
        marks = set(marks or ())
        self.specialised = tuple(
            i not in marks and name not in marks for i, name in enumerate(kernel.arg_names)
        )

    def run(self, grid: Sequence[int], args: Sequence[Any], constexprs: dict[str, Any]) -> None:
        """`kernel[grid](*args, **constexprs)` (every non-constexpr argument in `args`, in order), keyed by what
        Triton specialises its variant on: each argument's `arg_key`, the constexprs and the launch options."""
        self(tuple(map(arg_key, args, self.specialised)) + tuple(constexprs.items()), grid, args, constexprs)

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
                self.variants[(device, key)] = direct_variant(compiled)
            return
        values = [*args, *(constexprs[name] for name in self.kernel.arg_names[len(args) :])]
        g = (*grid, 1, 1)
        compiled = variant.compiled
        head = (g[0], g[1], g[2], driver.active.get_current_stream(device), compiled.function)
        if variant.launch is None:
            compiled.run(*head, compiled.packed_metadata, None, None, None, *values)
        else:
            for i, meta in reversed(variant.descriptors):  # from the back: each grows `values` past itself
                values[i : i + 1] = self._encoded(values[i], meta)
            run = compiled.run
            # As Triton's launcher calls it: no scratch buffers (`direct_variant`), no launch metadata or hooks.
            variant.launch(
                *head, run.launch_cooperative_grid, run.launch_pdl, None, None,
                compiled.packed_metadata, None, None, None, *values,
            )  # fmt: skip
        self.launches[1] += 1

    def _encoded(self, desc: Any, meta: Any) -> list[Any]:
        """The launcher's arguments for tensor descriptor `desc` (Triton's `make_tensordesc_arg`), kept."""
        key = (desc.base.data_ptr(), tuple(desc.shape), tuple(desc.strides), desc.padding, id(meta))
        encoded = self.descriptors.get(key)
        if encoded is None:
            if len(self.descriptors) >= MAX_DESCRIPTORS:
                self.descriptors.clear()
            encoded = self.descriptors[key] = make_tensordesc_arg(desc, meta)
            self.encodings += 1
        return encoded

    def forget(self) -> None:
        """Drop every variant found so far (the next call per key goes through Triton again) and every
        descriptor's encoding."""
        self.variants.clear()
        self.descriptors.clear()
