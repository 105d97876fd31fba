"""`scripts/gpu_check.sh` with `$OUT` set rewrites its one archive after each step, and on a time limit's SIGTERM
archives the step cut short too: a device call that runs out of time still brings back every log so far."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.gpu_check_run import REPO

# `bench offload`'s stand-in: W7 finishes at once; W6 prints a line, then hangs until a signal ends it.
FAKE_RI = """
case "$*" in
  *W7*) echo "N  round  none"; echo "2  1  1.00";;
  *) echo "# gpu: engine ready in 1.0 s"; exec sleep 600;;
esac
"""


def archived(out: Path) -> dict[str, str]:
    with tarfile.open(out / "gpu_check_logs.tgz") as tar:
        return {Path(m.name).name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


@pytest.mark.skipif(os.name != "posix", reason="bash script")
def test_a_call_cut_short_brings_back_the_finished_and_the_interrupted_steps_logs(tmp_path: Path) -> None:
    (tmp_path / "ri.sh").write_text(FAKE_RI)
    out, logs = tmp_path / "out", tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env |= {"OUT": str(out), "GPU_CHECK_LOGS": str(logs), "RI": f"bash {tmp_path}/ri.sh"}
    run = subprocess.run(
        ["timeout", "5", "bash", "scripts/gpu_check.sh", "offload"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 124, run.stdout + run.stderr  # timeout(1)'s: the limit ended it
    assert "=== stopped by a signal" in run.stdout
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check_logs.tgz"]  # one file, no half-written one
    files = archived(out)
    assert "2  1  1.00" in files["offload-W7-qwen2.5-0.5b.log"]  # the finished step
    assert "engine ready" in files["offload-W6-qwen2.5-0.5b.log"]  # the step the limit cut short
