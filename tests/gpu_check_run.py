"""`scripts/gpu_check.sh` run the way its tests run it: from the repository root, this environment plus `env`
(without `OUT` unless `env` names it), output captured."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_gpu_check(section: str, timeout: int, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "OUT"} | env
    return subprocess.run(
        ["bash", "scripts/gpu_check.sh", section],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
