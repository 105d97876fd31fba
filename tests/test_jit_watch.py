"""watch_triton_compiles counts compiles through Triton's post-compile hook and gives the hook back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from roseinfer.bench.jit_watch import format_compiles, watch_triton_compiles

knobs = pytest.importorskip("triton").knobs


def test_counts_per_kernel_and_chains_and_restores_the_hook() -> None:
    seen = []

    def previous(**kwargs):
        seen.append(kwargs["fn"].name)

    knobs.runtime.jit_post_compile_hook = previous
    try:
        with watch_triton_compiles() as compiled:
            for name in ("_decode_kernel", "_prefill_kernel", "_decode_kernel"):
                knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name=name), key="k")
        assert compiled == {"_decode_kernel": 2, "_prefill_kernel": 1}
        assert seen == ["_decode_kernel", "_prefill_kernel", "_decode_kernel"]  # the earlier hook still ran
        assert knobs.runtime.jit_post_compile_hook is previous
    finally:
        knobs.runtime.jit_post_compile_hook = None


def test_report_line() -> None:
    assert format_compiles({}) == "Triton compiles in the timed run: 0"
    assert format_compiles({"b": 1, "a": 2}) == "Triton compiles in the timed run: 3 (a x2, b x1)"
