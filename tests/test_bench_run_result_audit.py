"""The throughput figures of a timed run (`RunResult`): output tok/s = completion tokens / elapsed, total tok/s =
(prompt + completion tokens) / elapsed, each report line carrying the number it names; and W1's ratio to HF
`generate` (output tok/s over HF's) and the floor `bench throughput` reports, with the engine, HF and the
device faked."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from roseinfer.bench import throughput
from roseinfer.bench.roofline_floor import roofline_floor
from roseinfer.bench.run_result import RunResult
from roseinfer.bench.workloads import Workload, build_workload
from roseinfer.engine.startup import StartupReport
from roseinfer.entrypoints.cli import main


def line_value(text: str, label: str) -> str:
    m = re.search(rf"^{re.escape(label)}: (.+)$", text, re.M)
    assert m, f"no {label!r} line in\n{text}"
    return m.group(1)


def test_throughputs_and_report_lines():
    rng = np.random.default_rng()
    prompt, completion = (int(x) for x in rng.integers(1, 10**6, size=2))
    prefill, decode = (float(x) for x in rng.uniform(0.01, 10, size=2))
    total = prefill + decode
    wait, median = float(rng.uniform(0, total)), float(rng.uniform(1e-4, 1e-2))
    r = RunResult("continuous", 64, prefill, decode, total, prompt, completion)
    r.extra.update(device_wait_time=wait, decode_step_median_s=median, num_decode_steps=127)
    assert r.total_tokens == prompt + completion
    assert r.completion_throughput == pytest.approx(completion / total, rel=1e-12)
    assert r.total_throughput == pytest.approx((prompt + completion) / total, rel=1e-12)
    text = r.report()
    assert text.splitlines()[0] == "=== continuous ==="
    assert line_value(text, "Requests") == "64"
    assert float(line_value(text, "Elapsed (prefill/add)").removesuffix(" seconds")) == pytest.approx(
        prefill, abs=1e-6
    )
    assert float(line_value(text, "Elapsed (decode/run)").removesuffix(" seconds")) == pytest.approx(
        decode, abs=1e-6
    )
    assert float(line_value(text, "Elapsed (total)").removesuffix(" seconds")) == pytest.approx(
        total, abs=1e-6
    )
    assert line_value(text, "Prompt tokens") == str(prompt)
    assert line_value(text, "Completion tokens") == str(completion)
    assert line_value(text, "Total tokens") == str(prompt + completion)
    out = float(line_value(text, "Throughput (completion)").removesuffix(" tokens/s"))
    assert out == pytest.approx(completion / total, abs=0.006)
    both = float(line_value(text, "Throughput (total)").removesuffix(" tokens/s"))
    assert both == pytest.approx((prompt + completion) / total, abs=0.006)
    m = re.fullmatch(
        r"([\d.]+) seconds \((\d+)% of elapsed\)", line_value(text, "Host blocked on the device")
    )
    assert (
        m
        and float(m.group(1)) == pytest.approx(wait, abs=1e-6)
        and int(m.group(2)) == round(100 * wait / total)
    )
    m = re.fullmatch(r"127, median ([\d.]+) ms per step\(\) call", line_value(text, "Decode-only steps"))
    assert m and float(m.group(1)) == pytest.approx(median * 1e3, abs=1e-3)
    d = r.to_dict()
    assert (d["total_tokens"], d["completion_throughput"], d["total_throughput"]) == (
        r.total_tokens,
        r.completion_throughput,
        r.total_throughput,
    )
    assert (d["prompt_tokens"], d["completion_tokens"], d["total_time"]) == (prompt, completion, total)


def test_bench_throughput_reports_the_ratio_to_hf_and_the_floor_of_what_ran(
    monkeypatch, capsys, tmp_path: Path
):
    """`bench throughput --mode all --peer hf` with the engine runs, HF and the device limits faked (no GPU):
    the ratio to HF is output tok/s over HF's, and the floor is the one of the workload at the largest batch any
    mode ran (naive: 1 sequence), the KV cache's element type and the prefix cache as the runs had them."""
    rng = np.random.default_rng()
    real_config = throughput.make_engine_config
    configs: list[Any] = []

    def fake_config(model: str, **kw: Any) -> tuple[Any, str]:
        kw["device"] = "cpu"
        cfg, path = real_config(model, **kw)
        configs.append(cfg)
        fake = SimpleNamespace(
            model_config=cfg.model_config, device=torch.device("cuda"), dtype=torch.bfloat16,
            scheduler=cfg.scheduler, cache=cfg.cache,
        )  # fmt: skip
        return fake, path

    def fake_result(name: str, workload: Workload) -> RunResult:
        t = float(rng.uniform(0.5, 5))
        return RunResult(name, workload.num_requests, t / 3, t * 2 / 3, t, workload.num_prompt_tokens,
                         workload.num_output_tokens)  # fmt: skip

    class FakeEngine:
        def __init__(self, config: Any, path: str, model: Any) -> None:
            self.core = SimpleNamespace(
                runner=SimpleNamespace(model="weights"), startup=StartupReport((), 1, 16, 0, 0)
            )

    bw, tf = float(rng.uniform(1e12, 5e12)), float(rng.uniform(100, 1000))
    monkeypatch.setattr(throughput, "make_engine_config", fake_config)
    monkeypatch.setattr(throughput, "LLMEngine", FakeEngine)
    monkeypatch.setattr(throughput, "run_engine", lambda engine, w, name: fake_result(name, w))
    monkeypatch.setattr(throughput, "build_hf_model", lambda *a: "hf")
    monkeypatch.setattr(throughput, "export_to_hf", lambda *a: None)
    monkeypatch.setattr(throughput, "run_hf", lambda model, w, device, batch: fake_result("hf", w))
    monkeypatch.setattr(throughput, "measure_copy_bandwidth", lambda device: bw)
    monkeypatch.setattr(throughput, "measure_matmul_tflops", lambda device, dtype: tf)
    monkeypatch.setattr(throughput, "free_memory", lambda device: None)
    monkeypatch.setattr(throughput, "bench_header", lambda *a, **kw: {"workload": "W1"})
    monkeypatch.setattr(throughput, "format_header", lambda header: "# header")
    batch = int(rng.integers(2, 64))
    for mode, extra, seqs, cached, kv in (
        ("all", ["--max-num-seqs", str(batch)], batch, True, torch.bfloat16),
        ("naive", ["--kv-cache-dtype", "fp8"], 1, True, torch.float8_e4m3fn),
        ("continuous", ["--no-enable-prefix-caching"], 256, False, torch.bfloat16),
    ):
        configs.clear()
        out_json = tmp_path / f"{mode}.json"
        argv = ["bench", "throughput", "--model-shape", "tiny-llama", "--workload", "W4", "--mode", mode,
                "--peer", "hf", "--num-requests", "5", "--max-prompt-len", "40", "--json", str(out_json), *extra]  # fmt: skip
        assert main(argv) == 0
        text = capsys.readouterr().out
        report = json.loads(out_json.read_text())
        hf = report["peer"]
        for name, ours in report["results"].items():
            want = (ours["completion_tokens"] / ours["total_time"]) / (
                hf["completion_tokens"] / hf["total_time"]
            )
            assert report["ratio_to_hf"][name] == pytest.approx(want, rel=1e-9)
            printed = float(
                line_value(text, f"Ratio roseinfer/HF (completion tok/s), {name}").removesuffix("x")
            )
            assert printed == pytest.approx(want, abs=0.006)
        assert configs[1:] and all(
            c.cache.enable_prefix_caching == cached for c in configs[1:]
        )  # [0]: the probe
        w = build_workload("W4", 32000, num_requests=5, max_prompt_len=40)
        cfg = configs[0].model_config
        want_floor = roofline_floor(cfg, torch.bfloat16, w, seqs, bw, tf, kv_dtype=kv, prefix_caching=cached)
        assert report["roofline"] == pytest.approx(want_floor, rel=1e-12)
