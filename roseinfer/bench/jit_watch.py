"""Triton kernels compiled while a block runs: a timed run that compiles is timing the compiler.

Triton compiles one variant per kernel for each new combination of constexprs and argument
specialisations (an int equal to 1, or divisible by 16; pointer alignment). A warm-up that missed one
leaves its compile, tens to hundreds of milliseconds, in the timed run.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Compiles(Counter[str]):
    """Per kernel name, the variants compiled (or loaded from Triton's disk cache) in the block; `seconds`
    per kernel name, from Triton's pre-compile hook to its post-compile hook; `variants`, each one's launch
    options and constants (`describe_variant`), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[str, float] = {}
        self.variants: list[str] = []

    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def report(self) -> dict[str, object]:
        """The JSON reports' keys: compiles per kernel name and their seconds in all."""
        return {"triton_compiles": dict(self), "triton_compile_seconds": self.total_seconds()}


def describe_variant(hook_kwargs: dict[str, Any]) -> str:
    """`name[launch options](PARAM=value, ...)`: the options from Triton's own description, then the arguments
    compiled in as constants (the constexprs, and ints specialised as 1), by parameter name. (Triton 3.6's
    description puts the characters of its cache-key string where the argument list should be.)"""
    fn = hook_kwargs["fn"]
    text = str(hook_kwargs.get("repr", fn.name))
    head = text.split("](", 1)[0] + "]" if "](" in text else text.split("(", 1)[0]
    constants = (hook_kwargs.get("compile") or {}).get("constants") or {}
    params = getattr(getattr(fn, "jit_function", None), "params", [])
    names = [getattr(p, "name", "?") for p in params]
    args = [
        f"{names[path[0]]}={value}"
        for path, value in constants.items()
        if isinstance(path, tuple) and len(path) == 1 and path[0] < len(names)
    ]
    return f"{head}({', '.join(args)})"


@contextmanager
def watch_triton_compiles() -> Iterator[Compiles]:
    """Counts and times, per kernel name, the variants Triton compiles (or loads from its disk cache) in the
    block. Hooks set before it still run; both are given back after."""
    compiled = Compiles()
    try:
        from triton import knobs
    except ImportError:  # no Triton: nothing can compile
        yield compiled
        return
    runtime = knobs.runtime
    previous_pre, previous_post = runtime.jit_cache_hook, runtime.jit_post_compile_hook
    started: dict[str, float] = {}

    def pre(**kwargs: Any) -> Any:
        started[kwargs["fn"].name] = time.perf_counter()
        # An earlier hook's truthy answer makes Triton skip the compile: pass it on.
        return previous_pre(**kwargs) if previous_pre is not None else None

    def post(**kwargs: Any) -> Any:
        name = kwargs["fn"].name
        now = time.perf_counter()
        compiled[name] += 1
        compiled.seconds[name] = compiled.seconds.get(name, 0.0) + now - started.pop(name, now)
        compiled.variants.append(describe_variant(kwargs))
        return previous_post(**kwargs) if previous_post is not None else None

    runtime.jit_cache_hook, runtime.jit_post_compile_hook = pre, post
    try:
        yield compiled
    finally:
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = previous_pre, previous_post


def format_compiles(
    compiled: dict[str, int], seconds: float | None = None, where: str = "in the timed run"
) -> str:
    names = ", ".join(f"{name} x{n}" for name, n in sorted(compiled.items()))
    took = f" in {seconds:.1f} s" if seconds is not None and compiled else ""
    return f"Triton compiles {where}: {sum(compiled.values())}{took}" + (f" ({names})" if names else "")
