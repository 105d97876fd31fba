"""Kernel tests: on a machine without CUDA, run Triton kernels through its CPU interpreter.

TRITON_INTERPRET must be set before any kernel is defined (Triton reads it when `@triton.jit` runs), so it
is set here, at import, before the test modules import triton or roseinfer.kernels.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
