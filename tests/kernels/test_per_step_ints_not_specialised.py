"""Integer arguments whose value changes from one step to the next are not specialised on.

Triton compiles a variant per value class of each int argument (equal to 1, divisible by 16, other). A block
table's row stride is its width, which an eager step sizes to its longest sequence: a width divisible by 16
in one step and not in the next compiled a second prefill kernel in the middle of a served burst (838 ms
on an H100, qwen2.5-0.5b W8). Read from the launched kernels' definitions, so the interpreter is off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PER_STEP = {"stride_btb", "first_seq", "tile_stride", "num_splits"}

LIST_SPECIALISED = """
import importlib, inspect, json, pkgutil
import triton
import roseinfer.kernels as pkg
found = {}
for info in pkgutil.iter_modules(pkg.__path__):
    module = importlib.import_module(f"roseinfer.kernels.{info.name}")
    source = inspect.getsource(module)
    for name, obj in vars(module).items():
        # Launched kernels only (`name[grid](...)` or through `DirectLaunch(name)`): a device function is compiled
        # into its caller.
        launched = f"{name}[" in source or f"DirectLaunch({name})" in source
        if isinstance(obj, triton.runtime.jit.JITFunction) and launched:
            found[f"{info.name}.{name}"] = {p.name: bool(p.do_not_specialize) for p in obj.params}
print(json.dumps(found))
"""


def test_no_kernel_specialises_on_an_int_that_changes_every_step() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", LIST_SPECIALISED], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    kernels = json.loads(out.stdout.splitlines()[-1])
    assert (
        "paged_prefill_attention._prefill_kernel" in kernels
        and "paged_decode_attention._decode_kernel" in kernels
    )
    specialised = {
        f"{kernel}({param})"
        for kernel, params in kernels.items()
        for param, fixed in params.items()
        if param in PER_STEP and not fixed
    }
    assert not specialised, f"specialised on a per-step int: {sorted(specialised)}"
