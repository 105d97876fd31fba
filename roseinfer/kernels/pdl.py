"""Programmatic dependent launch (PDL, sm_90 and later).

A kernel launched with PDL may start while the kernel before it in the stream is still running, once every
program of that kernel has let its dependents go (or exited). Its programs must not read what the previous
kernel writes, nor write anything, before `wait_for_producer`, which blocks until the previous kernel has
finished and its writes are visible. Each program then lets its own dependents go, so the next launch's
fixed cost (launch, program start-up, the loads that do not depend on this kernel) overlaps this one.

Waiting before letting go keeps the order transitive: once a kernel is past its wait, every kernel before it
in the chain has finished, so a kernel may read what any earlier kernel wrote. A kernel that is not launched
with PDL (cuBLAS, torch) is waited for in full as usual.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from roseinfer.kernels._common import is_interpret

# `PDL` as this value: wait as usual, but let the next kernel launch only as each program exits (a probe's
# setting, `scripts/ab_pdl_decode.py`: do waiting dependents slow the kernels they wait on?).
RELEASE_AT_EXIT = 2


@triton.jit
def wait_for_producer(PDL: tl.constexpr):
    """Under PDL: wait until the previous kernel has finished and its writes are visible, then let the next
    kernel launch. Nothing at all without PDL."""
    if PDL:
        gdc_wait()
        if PDL != 2:  # RELEASE_AT_EXIT (a jit function reads no plain globals)
            gdc_launch_dependents()


def pdl_active(pdl: bool) -> bool:
    """PDL as asked, except under the interpreter, which runs launches one after another anyway (so a chain's
    kernels can be checked on the CPU)."""
    return pdl and not is_interpret()


def pdl_kwargs(pdl: bool) -> dict[str, bool]:
    """A PDL-capable kernel's launch arguments: its `PDL` constexpr (for `wait_for_producer`) and Triton's
    launch option, from one flag, so that the two cannot disagree."""
    active = pdl_active(pdl)
    return {"PDL": True, "launch_pdl": True} if active else {"PDL": False}


def pdl_supported(device: torch.device) -> bool:
    """PDL needs an sm_90+ GPU; the interpreter has none."""
    if device.type != "cuda" or is_interpret():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index) >= (9, 0)
