"""A stand-in `vllm` package on the PYTHONPATH of the peer processes a test starts (the real one runs only on the GPU
machine): its files, written under the test's folder, log what the peer asked of them to one JSON-lines file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


# The head of a stand-in `vllm/__init__.py` that runs `LLM.generate`: its version, `log(**entry)` to FAKE_VLLM_LOG,
# and a SamplingParams that keeps its keywords (`.kw`). A test's own LLM follows it.
GENERATE_PRELUDE = """
import json, os, time
__version__ = "0.0-stand-in"
LOG = os.environ["FAKE_VLLM_LOG"]

def log(**entry):
    with open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\\n")

class SamplingParams:
    def __init__(self, **kw):
        self.kw = kw
"""


def install_fake_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str], **env: float
) -> Path:
    """Writes `files` (path -> text) as a package root ahead of the repository on PYTHONPATH, sets FAKE_VLLM_<NAME>
    for each of `env`, and returns the log the stand-in writes to (FAKE_VLLM_LOG)."""
    root = tmp_path / "fake"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    log = tmp_path / "vllm.log"
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(root), str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    for name, value in env.items():
        monkeypatch.setenv(f"FAKE_VLLM_{name.upper()}", str(value))
    return log


def entries(log: Path, kind: str) -> list[dict]:
    """The log's entries of one kind, in order."""
    return [e for line in log.read_text().splitlines() if (e := json.loads(line))["kind"] == kind]
