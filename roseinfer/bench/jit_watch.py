"""Triton kernels compiled while a block runs: a timed run that compiles is timing the compiler.

Triton compiles one variant per kernel for each new combination of constexprs and argument
specialisations (an int equal to 1, or divisible by 16; pointer alignment). A warm-up that missed one
leaves its compile, tens to hundreds of milliseconds, in the timed run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def watch_triton_compiles() -> Iterator[Counter[str]]:
    """Counts, per kernel name, the variants Triton compiles (or loads from its disk cache) in the block."""
    compiled: Counter[str] = Counter()
    try:
        from triton import knobs
    except ImportError:  # no Triton: nothing can compile
        yield compiled
        return
    previous = knobs.runtime.jit_post_compile_hook

    def hook(**kwargs: Any) -> Any:
        compiled[kwargs["fn"].name] += 1
        return previous(**kwargs) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = hook
    try:
        yield compiled
    finally:
        knobs.runtime.jit_post_compile_hook = previous


def format_compiles(compiled: dict[str, int]) -> str:
    names = ", ".join(f"{name} x{n}" for name, n in sorted(compiled.items()))
    return f"Triton compiles in the timed run: {sum(compiled.values())}" + (f" ({names})" if names else "")
