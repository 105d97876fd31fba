"""Profiler ranges for every engine stage (torch profiler `record_function`, plus NVTX when enabled)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

NVTX = os.environ.get("ROSEINFER_NVTX", "0") == "1"


@contextlib.contextmanager
def record(name: str) -> Iterator[None]:
    nvtx = NVTX and torch.cuda.is_available()
    if nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        if nvtx:
            torch.cuda.nvtx.range_pop()
