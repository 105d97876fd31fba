"""What every benchmark prints beside its numbers (WORKLOADS.md), and the device's own limits.

`bench_header` names the workload, the model shape, the device, the commit, the versions, the exact
command line and the date. `measure_copy_bandwidth` / `measure_matmul_tflops` measure, in the same run,
the two limits a roofline floor is computed from.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

_REPO_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _git(*args: str, cwd: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit(repo_dir: str = _REPO_DIR) -> str:
    """$ROSEINFER_COMMIT when set (a copy of the tree on a device machine may carry a stale .git), else
    the short sha of HEAD, with "-dirty" when tracked files are modified or untracked files exist
    (untracked source files change what runs), else "unknown"."""
    if os.environ.get("ROSEINFER_COMMIT"):
        return os.environ["ROSEINFER_COMMIT"]
    sha = _git("rev-parse", "--short", "HEAD", cwd=repo_dir)
    if not sha:
        return "unknown"
    status = _git("status", "--porcelain", cwd=repo_dir)
    return f"{sha}-dirty" if status else sha


def device_name(device: str | torch.device | None = None) -> str:
    dev = torch.device(device) if device is not None else None
    if dev is None:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    return "cpu" if dev.type == "cpu" else str(dev)


def triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "not installed"
    return str(triton.__version__)


def command_line(argv: Sequence[str] | None = None) -> str:
    argv = list(sys.argv if argv is None else argv)
    if argv and argv[0]:
        argv[0] = os.path.basename(argv[0])
    return shlex.join(argv)


def bench_header(
    workload_id: str,
    model_shape: str,
    command: str | Sequence[str] | None = None,
    device: str | torch.device | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The fields every report starts with; `command` defaults to this process's sys.argv."""
    cmd = command if isinstance(command, str) else command_line(command)
    header: dict[str, Any] = {
        "workload": workload_id,
        "model_shape": model_shape,
        "device": device_name(device),
        "commit": git_commit(),
        "torch": torch.__version__,
        "triton": triton_version(),
        "python": platform.python_version(),
        "command": cmd,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    header.update(extra)
    return header


def write_json_report(path: str, report: dict[str, Any], indent: int = 2) -> None:
    """Writes a bench report to `path` (its folder made if missing: a run must not end in a FileNotFoundError)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=indent)


def format_header(header: dict[str, Any]) -> str:
    width = max(len(k) for k in header)
    return "\n".join(f"# {k.ljust(width)} : {v}" for k, v in header.items())


# -- device limits ---------------------------------------------------------------------------------


def _require_cuda(device: str | torch.device) -> torch.device:
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"device limits are measured on a CUDA device, got {dev}")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _event_seconds(fn: Callable[[], None], calls: int) -> float:
    """Device seconds from before the first of `calls` calls of `fn` to after the last, waiting for the end."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _warm_up(fn: Callable[[], None], device: torch.device, warmup: int) -> None:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)


def median_time(fn: Callable[[], None], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of `fn` over `repeats` runs, each timed with CUDA events."""
    with torch.cuda.device(device):
        _warm_up(fn, device, warmup)
        return statistics.median(_event_seconds(fn, 1) for _ in range(repeats))


def back_to_back_time(
    fn: Callable[[], None], device: torch.device, warmup: int, repeats: int, rounds: int = 5
) -> float:
    """Median over `rounds` of the seconds per call of `fn` called `repeats` times in a row, without waiting
    for the device between calls: a decode loop's steady state, where the host prepares the next step while
    the device runs this one. (`median_time` waits for each call, so its figure also holds the device's idle
    time while the host prepares the call.)"""
    with torch.cuda.device(device):
        _warm_up(fn, device, warmup)
        times = []
        for _ in range(rounds):
            fn()  # queued ahead of the start event: the device is busy while the host prepares the first timed call
            times.append(_event_seconds(fn, repeats) / repeats)
    return statistics.median(times)


@torch.inference_mode()
def measure_copy_bandwidth(
    device: str | torch.device, num_bytes: int = 1 << 30, warmup: int = 3, repeats: int = 20
) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    dev = _require_cuda(device)
    seconds = _time_copy(dev, num_bytes, warmup, repeats)
    torch.cuda.empty_cache()
    return 2 * num_bytes / seconds


def _time_copy(dev: torch.device, num_bytes: int, warmup: int, repeats: int) -> float:
    src = torch.empty(num_bytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    src.fill_(1)
    return median_time(lambda: dst.copy_(src), dev, warmup, repeats)


@torch.inference_mode()
def measure_matmul_tflops(
    device: str | torch.device,
    dtype: torch.dtype = torch.bfloat16,
    n: int = 8192,
    warmup: int = 3,
    repeats: int = 20,
) -> float:
    """Dense n^3 matrix product rate in TFLOP/s (2 n^3 FLOPs per product), random data."""
    dev = _require_cuda(device)
    seconds = _time_matmul(dev, dtype, n, warmup, repeats)
    torch.cuda.empty_cache()
    return 2 * n**3 / seconds / 1e12


def _time_matmul(dev: torch.device, dtype: torch.dtype, n: int, warmup: int, repeats: int) -> float:
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=dev, dtype=dtype)
    return median_time(lambda: torch.matmul(a, b, out=out), dev, warmup, repeats)
