"""`bench throughput`'s wiring with the engine runs, HF and the device limits faked (no GPU): what the header says
(workload, shape, dtype, modes, peer; WORKLOADS.md's commit and command line), which workload each run gets
(warm-up first, then the timed one), the flags that reach HF and the device limits, the floor lines of every
run including HF's, the JSON report's shape; and the header helpers of `roseinfer.bench.env` (commit with
-dirty, command line, aligned fields) on their own."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from roseinfer.bench import env, throughput
from roseinfer.bench.run_result import RunResult
from roseinfer.bench.workloads import Workload, build_workload
from roseinfer.engine.startup import StartupReport
from roseinfer.entrypoints.cli import main
from roseinfer.models.loader import BUILTIN_CONFIG_DIR


class Fakes:
    """Everything `run_throughput` calls that needs a GPU or takes long, recording its arguments."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rng = np.random.default_rng()
        self.engine_runs: list[tuple[str, Workload]] = []
        self.hf_runs: list[tuple[Workload, int | None]] = []
        self.matmul_dtypes: list[torch.dtype] = []
        self.headers: list[dict[str, Any]] = []
        self.bw, self.tf = float(self.rng.uniform(1e12, 5e12)), float(self.rng.uniform(100, 1000))
        real_config, real_header = throughput.make_engine_config, throughput.bench_header

        def fake_config(model: str, **kw: Any) -> tuple[Any, str]:
            kw["device"] = "cpu"
            cfg, path = real_config(model, **kw)
            fake = SimpleNamespace(model_config=cfg.model_config, device=torch.device("cuda"), dtype=cfg.dtype,
                                   scheduler=cfg.scheduler, cache=cfg.cache)  # fmt: skip
            return fake, path

        def fake_header(*a: Any, **kw: Any) -> dict[str, Any]:
            header = real_header(*a, **kw)
            self.headers.append(header)
            return header

        def run_engine(engine: Any, w: Workload, name: str) -> RunResult:
            self.engine_runs.append((name, w))
            return self.result(name, w)

        def run_hf(model: Any, w: Workload, device: Any, batch: int | None) -> RunResult:
            self.hf_runs.append((w, batch))
            return self.result("hf", w)

        def matmul(device: Any, dtype: torch.dtype) -> float:
            self.matmul_dtypes.append(dtype)
            return self.tf

        class FakeEngine:
            def __init__(self, config: Any, path: str, model: Any) -> None:
                self.core = SimpleNamespace(
                    runner=SimpleNamespace(model="weights"), startup=StartupReport((), 1, 16, 0, 0)
                )

        for name, value in {
            "make_engine_config": fake_config, "bench_header": fake_header, "LLMEngine": FakeEngine,
            "run_engine": run_engine, "run_hf": run_hf, "build_hf_model": lambda *a: "hf",
            "export_to_hf": lambda *a: None, "measure_copy_bandwidth": lambda device: self.bw,
            "measure_matmul_tflops": matmul, "free_memory": lambda device: None,
        }.items():  # fmt: skip
            monkeypatch.setattr(throughput, name, value)

    def result(self, name: str, w: Workload) -> RunResult:
        t = float(self.rng.uniform(0.5, 5))
        return RunResult(name, w.num_requests, t / 3, t * 2 / 3, t, w.num_prompt_tokens, w.num_output_tokens)


SCALE = ["--num-requests", "5", "--max-prompt-len", "40", "--max-output-len", "6"]


def test_the_header_names_what_ran(monkeypatch, capsys, tmp_path: Path):
    fakes = Fakes(monkeypatch)
    config = tmp_path / "tiny-llama.json"
    config.write_text(Path(BUILTIN_CONFIG_DIR, "tiny-llama.json").read_text())
    for argv, shape, dtype, modes, peer in (
        (["--model", str(config), "--mode", "all", "--peer", "hf"], "tiny-llama", "bfloat16",
         "naive,static,continuous", "hf"),
        (["--model-shape", "tiny-llama", "--mode", "static", "--dtype", "float16"], "tiny-llama", "float16",
         "static", "none"),
    ):  # fmt: skip
        fakes.headers.clear()
        main(["bench", "throughput", "--workload", "w2", *SCALE, "--dtype", "bfloat16", *argv])
        (h,) = fakes.headers
        assert (h["workload"], h["model_shape"], h["dtype"], h["modes"], h["peer"]) == (
            "W2",
            shape,
            dtype,
            modes,
            peer,
        )
        w = build_workload("W2", 32000, num_requests=5, max_prompt_len=40, max_output_len=6)
        assert h["workload_description"] == w.description and h["workload_scaled"] is True
        text = capsys.readouterr().out
        for key, value in h.items():  # every field printed, one a line
            assert re.search(rf"^# {key}\s+: {re.escape(str(value))}$", text, re.M), key


def test_each_run_warms_up_on_other_prompts_first_and_hf_gets_its_batch_size(
    monkeypatch, capsys, tmp_path: Path
):
    fakes = Fakes(monkeypatch)
    batch = int(fakes.rng.integers(1, 5))
    out = tmp_path / "r.json"
    argv = ["bench", "throughput", "--model-shape", "tiny-llama", "--workload", "W1", "--mode", "all", *SCALE,
            "--peer", "hf", "--hf-batch-size", str(batch), "--json", str(out)]  # fmt: skip
    main(argv)
    timed = build_workload("W1", 32000, num_requests=5, max_prompt_len=40, max_output_len=6)
    names = [n for n, _ in fakes.engine_runs]
    assert names == [f"{m}{s}" for m in ("naive", "static", "continuous") for s in (" (warm-up)", "")]
    for (_, w), (_, warm) in zip(fakes.engine_runs[1::2], fakes.engine_runs[::2]):
        assert w.prompts == timed.prompts
        assert not set(map(tuple, warm.prompts)) & set(map(tuple, timed.prompts))
    (hf_warm, b1), (hf_timed, b2) = fakes.hf_runs
    assert hf_timed.prompts == timed.prompts and hf_warm.prompts != timed.prompts and b1 == b2 == batch
    text = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert set(report) == {"header", "workload", "results", "peer", "ratio_to_hf", "roofline", "startup"}
    assert list(report["startup"]) == ["naive", "static", "continuous"]  # each mode's engine
    assert report["startup"]["naive"] == StartupReport((), 1, 16, 0, 0).to_dict()
    assert report["workload"] == json.loads(json.dumps(timed.summary()))
    assert list(report["results"]) == ["naive", "static", "continuous"] == list(report["ratio_to_hf"])
    floor = report["roofline"]["floor_s"]
    for name, r in [*report["results"].items(), ("hf", report["peer"])]:  # HF's time against the floor too
        assert re.search(rf"^{name}: {r['total_time'] / floor:.2f}x floor$", text, re.M), name

    fakes.hf_runs.clear()
    i = argv.index("--hf-batch-size")
    main([*argv[:i], *argv[i + 2 :], "--mode", "naive"])
    assert [b for _, b in fakes.hf_runs] == [None, None]  # no --hf-batch-size: run_hf's own default


@pytest.mark.parametrize(("dtype", "matmul"), [("float16", torch.float16), ("bfloat16", torch.bfloat16),
                                               ("float32", torch.bfloat16)])  # fmt: skip
def test_the_matmul_rate_is_measured_in_the_runs_dtype_and_not_at_all_without_the_roofline(
    monkeypatch, capsys, tmp_path: Path, dtype: str, matmul: torch.dtype
):
    fakes = Fakes(monkeypatch)
    out = tmp_path / "r.json"
    argv = [
        "bench",
        "throughput",
        "--model-shape",
        "tiny-llama",
        *SCALE,
        "--dtype",
        dtype,
        "--json",
        str(out),
    ]
    main(argv)
    assert fakes.matmul_dtypes == [matmul]
    assert json.loads(out.read_text())["roofline"]["matmul_tflops"] == fakes.tf
    fakes.matmul_dtypes.clear()
    main([*argv, "--no-roofline"])
    assert fakes.matmul_dtypes == [] and json.loads(out.read_text())["roofline"] is None
    assert "x floor" not in capsys.readouterr().out.split("# workload")[-1]


# -- roseinfer.bench.env ---------------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_commit_is_the_short_head_with_dirty_for_any_change(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("ROSEINFER_COMMIT", raising=False)
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", "a.py")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    sha = git(tmp_path, "rev-parse", "--short", "HEAD")
    assert env.git_commit(str(tmp_path)) == sha
    (tmp_path / "b.py").write_text("y = 2\n")  # untracked source changes what runs
    assert env.git_commit(str(tmp_path)) == f"{sha}-dirty"
    (tmp_path / "b.py").unlink()
    (tmp_path / "a.py").write_text("x = 2\n")
    assert env.git_commit(str(tmp_path)) == f"{sha}-dirty"
    monkeypatch.setenv("ROSEINFER_COMMIT", "feedbee")
    assert env.git_commit(str(tmp_path)) == "feedbee"


def test_the_command_line_is_the_program_name_and_quoted_arguments():
    rng = np.random.default_rng()
    args = ["bench", "throughput", "--json", f"/tmp/a b{int(rng.integers(100))}.json", "--rates", "1,2"]
    line = env.command_line(["/some/venv/bin/roseinfer", *args])
    assert line.split(" ", 1)[0] == "roseinfer" and shlex.split(line) == ["roseinfer", *args]
    assert env.bench_header("W1", "m", command="as given", device="cpu")["command"] == "as given"


def test_the_header_lines_align_their_colons():
    rng = np.random.default_rng()
    keys = ["k" * int(n) for n in rng.choice(np.arange(1, 30), size=5, replace=False)]
    header = {k: f"v{i}" for i, k in enumerate(keys)}
    lines = env.format_header(header).splitlines()
    assert len(lines) == len(keys)
    width = max(map(len, keys))
    for line, (k, v) in zip(lines, header.items(), strict=True):
        assert line == f"# {k}{' ' * (width - len(k))} : {v}"


@pytest.mark.parametrize("value", ["0", "-1", "-7"])
def test_an_hf_batch_size_below_one_is_refused_by_name(monkeypatch, capsys, value: str):
    """--hf-batch-size 0 ran HF at its default batch, and a negative one gave HF no batch at all: 0 tokens, and the
    ratio divided by zero after every engine run had been timed."""
    Fakes(monkeypatch)
    with pytest.raises(SystemExit):
        main(
            [
                "bench",
                "throughput",
                "--model-shape",
                "tiny-llama",
                *SCALE,
                "--peer",
                "hf",
                "--hf-batch-size",
                value,
            ]
        )
    assert "argument --hf-batch-size: must be >= 1" in capsys.readouterr().err


def test_device_timers_give_seconds_per_call(monkeypatch):
    """`median_time`: the median of single timed calls; `back_to_back_time`: the median over rounds of a round's
    time over its calls. CUDA events faked by a function of how many calls they span."""
    rng = np.random.default_rng()
    per_call = [float(t) for t in rng.uniform(1e-4, 1e-2, size=int(rng.integers(1, 8)) * 2 + 1)]
    spans: list[int] = []

    def event_seconds(fn: Any, calls: int) -> float:
        spans.append(calls)
        return calls * per_call[len(spans) - 1]

    monkeypatch.setattr(env, "_event_seconds", event_seconds)
    monkeypatch.setattr(env, "_warm_up", lambda fn, device, warmup: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    repeats = int(rng.integers(2, 50))
    got = env.back_to_back_time(lambda: None, torch.device("cpu"), 1, repeats, rounds=len(per_call))
    assert spans == [repeats] * len(per_call) and got == pytest.approx(float(np.median(per_call)), rel=1e-12)
    spans.clear()
    got = env.median_time(lambda: None, torch.device("cpu"), 1, len(per_call))
    assert spans == [1] * len(per_call) and got == pytest.approx(float(np.median(per_call)), rel=1e-12)
