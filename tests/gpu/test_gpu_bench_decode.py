"""`roseinfer bench decode` on a GPU: each row's floor is the roofline's bytes over the bandwidth measured in the
run, and the step the two generate runs give is slower than that floor and of the order of the engine's own decode
steps (a window that subtracted wrong, or timed the prefill, would miss both)."""

from __future__ import annotations

import json

import pytest
import torch

from roseinfer.bench.roofline import decode_floor_bytes
from roseinfer.config import ModelConfig
from roseinfer.entrypoints.cli import main
from roseinfer.models.loader import resolve_model_path

pytestmark = pytest.mark.gpu


def test_bench_decode_rows_on_gpu(tmp_path):
    path = tmp_path / "decode.json"
    argv = ["bench", "decode", "--model-shape", "qwen2.5-0.5b", "--batches", "1,32", "--contexts", "512"]
    argv += ["--short", "16", "--long", "80", "--repeats", "2", "--gpu-memory-utilization", "0.3"]
    assert main([*argv, "--no-progress", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    cfg = ModelConfig.from_path(resolve_model_path("qwen2.5-0.5b", need_weights=False))
    bandwidth = report["bandwidth_bytes_per_s"]
    assert 1e12 < bandwidth < 2e13
    for row in report["rows"]:
        floor = decode_floor_bytes(cfg, 2, torch.bfloat16, row["batch"], row["context"]) / bandwidth
        assert row["floor_ms"] == pytest.approx(floor * 1e3)
        # qwen2.5-0.5b's graphed steps run at 1.2-4x their floor on the H100 and H200; a wrong window would read
        # the prefill (tens of ms) or nothing
        assert 1.0 < row["x_floor"] < 10.0, row
        assert row["long_s"] > row["short_s"]
