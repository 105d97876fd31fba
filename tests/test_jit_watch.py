"""watch_triton_compiles counts and times compiles through Triton's pre- and post-compile hooks, chains the
hooks set before it and gives them back."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from roseinfer.bench.jit_watch import format_compiles, watch_triton_compiles

knobs = pytest.importorskip("triton").knobs


def compile_(name: str, seconds: float = 0.0) -> None:
    """What Triton's JIT does on a kernel-cache miss: the pre-compile hook, the compile, the post-compile hook."""
    fn = SimpleNamespace(name=name)
    if knobs.runtime.jit_cache_hook(fn=fn, key="k", repr=f"{name}[num_warps=4]()"):
        return
    time.sleep(seconds)
    knobs.runtime.jit_post_compile_hook(fn=fn, key="k", repr=f"{name}[num_warps=4]()")


def test_counts_and_times_per_kernel_and_chains_and_restores_the_hooks() -> None:
    seen_pre, seen_post = [], []

    def previous_pre(**kwargs):
        seen_pre.append(kwargs["fn"].name)
        return None

    def previous_post(**kwargs):
        seen_post.append(kwargs["fn"].name)

    knobs.runtime.jit_cache_hook = previous_pre
    knobs.runtime.jit_post_compile_hook = previous_post
    try:
        with watch_triton_compiles() as compiled:
            compile_("_decode_kernel", 0.02)
            compile_("_prefill_kernel", 0.06)
            compile_("_decode_kernel", 0.02)
        assert compiled == {"_decode_kernel": 2, "_prefill_kernel": 1}
        assert 0.04 <= compiled.seconds["_decode_kernel"] < compiled.seconds["_prefill_kernel"]
        assert compiled.total_seconds() == pytest.approx(sum(compiled.seconds.values()))
        assert compiled.variants == [
            "_decode_kernel[num_warps=4]()",
            "_prefill_kernel[num_warps=4]()",
            "_decode_kernel[num_warps=4]()",
        ]
        expected = ["_decode_kernel", "_prefill_kernel", "_decode_kernel"]
        assert seen_pre == expected and seen_post == expected  # the earlier hooks still ran
        assert knobs.runtime.jit_cache_hook is previous_pre
        assert knobs.runtime.jit_post_compile_hook is previous_post
    finally:
        knobs.runtime.jit_cache_hook = None
        knobs.runtime.jit_post_compile_hook = None


def test_an_earlier_hook_that_skips_the_compile_is_obeyed() -> None:
    knobs.runtime.jit_cache_hook = lambda **kwargs: True
    try:
        with watch_triton_compiles() as compiled:
            compile_("_decode_kernel")
        assert compiled == {}
    finally:
        knobs.runtime.jit_cache_hook = None


def test_report_line() -> None:
    assert format_compiles({}) == "Triton compiles in the timed run: 0"
    assert format_compiles({"b": 1, "a": 2}) == "Triton compiles in the timed run: 3 (a x2, b x1)"
    assert (
        format_compiles({"a": 2}, 3.04, "in the warm-up")
        == "Triton compiles in the warm-up: 2 in 3.0 s (a x2)"
    )
    assert format_compiles({}, 0.0) == "Triton compiles in the timed run: 0"


def test_a_variant_is_named_by_its_launch_options_and_its_constants() -> None:
    """Triton 3.6's description of a variant holds its cache key's characters where the arguments should be: the
    watch keeps the launch options and names the constants (constexprs, ints compiled in as 1) by parameter."""
    params = [SimpleNamespace(name=n) for n in ("q_ptr", "n", "stride", "BLOCK_M", "KEY_SPLIT")]
    fn = SimpleNamespace(name="_prefill_kernel", jit_function=SimpleNamespace(params=params))
    garbage = "_prefill_kernel[num_warps=8, num_ctas=1, num_stages=2](q_ptr: (, n: ', stride: (, BLOCK_M: ', KEY_SPLIT: i)"
    with watch_triton_compiles() as compiled:
        knobs.runtime.jit_cache_hook(fn=fn, key="k", repr=garbage)
        knobs.runtime.jit_post_compile_hook(
            fn=fn, key="k", repr=garbage, compile={"constants": {(3,): 128, (4,): False, (2,): 1}}
        )
    assert compiled.variants == [
        "_prefill_kernel[num_warps=8, num_ctas=1, num_stages=2](BLOCK_M=128, KEY_SPLIT=False, stride=1)"
    ]
