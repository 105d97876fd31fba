"""Profiler ranges for every engine stage (torch profiler `record_function`, plus NVTX when enabled).

`record(name)` marks a stage ("schedule", "prepare_inputs", "forward", "sample", "update", "copy_blocks",
"kv_write"); `profile_to(path)` collects a torch profiler trace around a block and writes it as a
Chrome/Perfetto JSON file, which `roseinfer trace-sql TRACE "SELECT ..."` (roseinfer/trace_sql/) queries.
NVTX ranges (for Nsight Systems) are on when ROSEINFER_NVTX=1 or after `enable_nvtx(True)`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

NVTX = os.environ.get("ROSEINFER_NVTX", "0") == "1"


def enable_nvtx(flag: bool = True) -> bool:
    """Turns NVTX push/pop in `record` on or off (they still need CUDA); returns the previous setting."""
    global NVTX
    previous = NVTX
    NVTX = bool(flag)
    return previous


def nvtx_enabled() -> bool:
    return NVTX


_NULL = contextlib.nullcontext()


def record(name: str) -> contextlib.AbstractContextManager[None]:
    """A named range; free (a shared null context) unless a profiler runs or NVTX is on, since the
    engine enters these on its hot path (every step, and `kv_write` in every layer)."""
    if NVTX or torch._C._autograd._profiler_enabled():
        return _range(name)
    return _NULL


@contextlib.contextmanager
def _range(name: str) -> Iterator[None]:
    nvtx = NVTX and torch.cuda.is_available()
    if nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        if nvtx:
            torch.cuda.nvtx.range_pop()


def profiler_activities(gpu_only: bool = False) -> list[torch.profiler.ProfilerActivity]:
    """CPU, plus CUDA when a GPU is there; only CUDA with `gpu_only` (and a GPU).

    A GPU-only trace has no CPU ops or ranges and costs the host less, but CUPTI still makes each CUDA-graph
    launch dearer: W1 qwen ran at 33k tok/s traced this way, 40k untraced (H200). Kernel durations are
    unaffected; for wall-time shares see scripts/steady_decode_busy.py.
    """
    cuda = torch.profiler.ProfilerActivity.CUDA
    if torch.cuda.is_available():
        return [cuda] if gpu_only else [torch.profiler.ProfilerActivity.CPU, cuda]
    return [torch.profiler.ProfilerActivity.CPU]


def trace_path_for(path: str, part: str) -> str:
    """`path` with `part` before its extension, which stays (and with it gzip for ".gz"):
    trace.json -> trace.PART.json, trace.json.gz -> trace.PART.json.gz, trace -> trace.PART.json."""
    for ext in (".json.gz", ".json", ".gz"):
        if path.endswith(ext):
            return f"{path.removesuffix(ext)}.{part}{ext}"
    return f"{path}.{part}.json"


@contextlib.contextmanager
def profile_to(
    path: str | os.PathLike[str] | None, gpu_only: bool = False
) -> Iterator[torch.profiler.profile | None]:
    """Profiles the block and writes a Chrome/Perfetto JSON trace to `path` when it exits normally.

    `path=None` does nothing (yields None), so callers can write `with profile_to(args.profile):`.
    A path ending in ".gz" is written gzipped. The parent directory is created; the path is printed.
    `gpu_only` traces only GPU activity (see `profiler_activities`).
    """
    if path is None:
        yield None
        return
    out = os.fspath(path)
    parent = os.path.dirname(out)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with torch.profiler.profile(
        activities=profiler_activities(gpu_only), record_shapes=False, with_stack=False
    ) as prof:
        yield prof
    prof.export_chrome_trace(out)
    print(f'[profile] wrote: {out}  (query it: roseinfer trace-sql {out} "SELECT ...")')
