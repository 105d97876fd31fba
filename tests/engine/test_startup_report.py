"""The start-up report: each stage timed and its device memory read as the drop in free memory; the line
benchmarks and `generate` print."""

from __future__ import annotations

import time

import pytest
import torch

from roseinfer import LLM
from roseinfer.engine.startup import StartupReport, StartupStage, StartupTimer
from roseinfer.runner.kv_sizing import GIB

STAGES = ["load model", "profile", "KV cache", "kernel warm-up", "CUDA graphs"]


def test_an_engine_reports_each_stage_of_its_start_up(llama_dir) -> None:
    t0 = time.perf_counter()
    llm = LLM(llama_dir, device="cpu", block_size=4, cpu_kv_tokens=2048)
    took = time.perf_counter() - t0
    report = llm.engine.core.startup
    assert [s.name for s in report.stages] == STAGES
    assert all(s.seconds >= 0 and s.device_bytes == 0 for s in report.stages)  # CPU: no device memory read
    assert 0 < report.seconds <= took
    assert report.stage("load model").seconds > 0  # builds the model's weights
    assert (report.num_blocks, report.block_size) == (llm.engine.core.num_blocks, 4) == (512, 4)
    assert (report.num_decode_graphs, report.num_mixed_graphs) == (0, 0)
    assert report.line().endswith("KV cache 512 blocks = 2,048 tokens; no CUDA graphs")
    assert report.to_dict()["seconds"] == report.seconds


def test_a_stage_keeps_what_the_device_lost_over_it(monkeypatch) -> None:
    free = iter([10 * GIB, 8 * GIB, 8 * GIB, 9 * GIB])  # stage one takes 2 GiB, stage two gives 1 GiB back
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (next(free), 80 * GIB))
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: synced.append(device))
    device = torch.device("cuda", 0)
    timer = StartupTimer(device)
    with timer.stage("grows"):
        time.sleep(0.02)
    with timer.stage("shrinks"):
        pass
    grows, shrinks = timer.stages
    assert (grows.name, grows.device_bytes, shrinks.device_bytes) == ("grows", 2 * GIB, -GIB)
    assert grows.seconds >= 0.02
    assert synced == [device, device]  # each stage's time holds the device work it queued


def test_the_line_names_what_took_time_or_memory() -> None:
    report = StartupReport(
        stages=(
            StartupStage("load model", 3.2, int(15.5 * GIB)),
            StartupStage("profile", 0.01, 0),  # neither: left out
            StartupStage("KV cache", 0.2, 100 * GIB),
            StartupStage("kernel warm-up", 2.0, 2**20),  # 1 MiB: no GiB shown
            StartupStage("rounding", 0.03, 2**20),  # neither: left out
            StartupStage("CUDA graphs", 8.0, int(0.5 * GIB)),
        ),
        num_blocks=54_731,
        block_size=16,
        num_decode_graphs=35,
        num_mixed_graphs=16,
    )
    assert report.line() == (
        "Start-up: 13.4 s (load model 3.2 s, 15.50 GiB; KV cache 0.2 s, 100.00 GiB; kernel warm-up 2.0 s; "
        "CUDA graphs 8.0 s, 0.50 GiB); KV cache 54,731 blocks = 875,696 tokens; CUDA graphs: 35 decode, 16 mixed-step"
    )
    assert report.seconds == pytest.approx(13.44)
