"""`bench roofline`'s plot, `bench plot` (a saved report drawn again) and the W3 plot's dispatch."""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from roseinfer.bench import plots, roofline
from roseinfer.entrypoints.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def roofline_report(rng: np.random.Generator) -> dict:
    """A report shaped as `bench roofline` writes it, rows built by its own row functions, in a shuffled order
    with skipped rows mixed in."""
    bw, tflops = rng.uniform(1e12, 4e12), rng.uniform(200, 900)
    rows = []
    for context in (1024, 4096):
        for batch in rng.permutation([1, 16, 64, 256]).tolist():
            if context == 4096 and batch == 256:
                rows.append(
                    {"kind": "decode", "batch": batch, "context": context, "skipped": "KV does not fit"}
                )
                continue
            floor_bytes = int(rng.integers(10**8, 10**10))
            one = floor_bytes / bw * rng.uniform(1.0, 3.0)
            rows.append(roofline.decode_row(batch, context, True, one, one * 0.95, floor_bytes, bw))
    for n in (512, 2048, 8192):
        flops = 2 * 5e8 * n
        rows.append(
            roofline.prefill_row(n, n < 8192, flops / (tflops * 1e12) * rng.uniform(1.1, 2.0), flops, tflops)
        )
    rows.append({"kind": "prefill", "tokens": 32768, "skipped": "KV does not fit"})
    rng.shuffle(rows)
    header = {
        "workload": "roofline",
        "model_shape": "qwen2.5-0.5b",
        "device": "test GPU",
        "commit": "abc1234",
    }
    return {"header": header, "bandwidth_TBps": bw / 1e12, "matmul_TFLOPs": tflops, "rows": rows}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roofline_series_groups_sorts_and_drops_skipped_rows(seed):
    report = roofline_report(np.random.default_rng(seed))
    series = plots.roofline_series(report["rows"])
    assert list(series["decode"]) == [1024, 4096]
    for context, s in series["decode"].items():
        expected = sorted(
            (r["batch"], r["x_floor"], r["steady_x_floor"])
            for r in report["rows"]
            if r["kind"] == "decode" and r["context"] == context and "skipped" not in r
        )
        assert s["batch"] == [b for b, _, _ in expected]
        assert s["x_floor"] == [x for _, x, _ in expected]
        assert s["steady_x_floor"] == [x for _, _, x in expected]
    assert series["decode"][4096]["batch"] == [1, 16, 64]
    assert series["prefill_tokens"] == [512, 2048, 8192]
    by_tokens = {r["tokens"]: r for r in report["rows"] if r["kind"] == "prefill" and "skipped" not in r}
    assert series["prefill_pct"] == [by_tokens[n]["pct_matmul_rate"] for n in (512, 2048, 8192)]


def test_roofline_series_marks_a_row_without_a_steady_timing_as_missing():
    row = roofline.decode_row(8, 512, False, 2e-3, 1e-3, 10**9, 2e12)
    del row["steady_x_floor"]
    s = plots.roofline_series([row])["decode"][512]
    assert s["x_floor"] == [pytest.approx(4.0)]
    assert math.isnan(s["steady_x_floor"][0])


def test_roofline_plot_is_a_png(tmp_path):
    path = tmp_path / "r.png"
    assert plots.plot_roofline(roofline_report(np.random.default_rng(3)), str(path)) == str(path)
    width, height = png_size(path)
    assert width > 1000 and height > 400


def test_roofline_plot_is_skipped_quietly_without_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plots.plot_roofline(roofline_report(np.random.default_rng(4)), str(tmp_path / "r.png")) is None
    assert not (tmp_path / "r.png").exists()


def test_roofline_plot_path_follows_plot_then_json():
    assert roofline.roofline_plot_path(None, None) is None
    assert roofline.roofline_plot_path("out/r.json", None) == "out/r.roofline.png"
    assert roofline.roofline_plot_path("out/r", None) == "out/r.roofline.png"
    assert roofline.roofline_plot_path("out/r.json", "x.png") == "x.png"
    assert roofline.roofline_plot_path(None, "x.png") == "x.png"


def w3_report() -> dict:
    rows = [
        {"rate": rate, "cache": cache, "ttft_p99_ms": 10.0 * rate, "e2e_p99_s": 0.1 * rate}
        for rate in (1.0, 4.0, 2.0)
        for cache in ("off", "on")
    ]
    return {
        "header": {"workload": "W4,W3"},
        "results": {"W3": {"workload": {"slo_p99_s": 2.0}, "rows": rows}},
    }


def test_bench_plot_draws_a_saved_roofline_report(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(roofline_report(np.random.default_rng(5))))
    assert main(["bench", "plot", str(path)]) == 0
    png_size(tmp_path / "run.roofline.png")
    assert f"plot roofline: {tmp_path / 'run.roofline.png'}" in capsys.readouterr().out


def test_bench_plot_draws_a_saved_prefix_reports_w3(tmp_path):
    path = tmp_path / "prefix.json"
    path.write_text(json.dumps(w3_report()))
    assert main(["bench", "plot", str(path), "--out", str(tmp_path / "elsewhere")]) == 0
    png_size(tmp_path / "elsewhere.W3.png")
    assert not (tmp_path / "prefix.W3.png").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not json", "cannot read"),
        ("[1, 2]", "a report is a JSON object"),
        ('{"header": {"workload": "W1"}, "results": {"W1": {}}}', "no plot for this report (workload 'W1')"),
    ],
)
def test_bench_plot_refuses_what_it_cannot_draw(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)")):
        main(["bench", "plot", str(path)])
    assert list(tmp_path.glob("*.png")) == []


def test_bench_plot_without_matplotlib_says_how_to_get_it(monkeypatch, tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(roofline_report(np.random.default_rng(6))))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit, match=r"roseinfer\[plots\]"):
        main(["bench", "plot", str(path)])


def test_roofline_plot_of_a_report_whose_rows_were_all_skipped(tmp_path):
    report = roofline_report(np.random.default_rng(7))
    report["rows"] = [{**r, "skipped": "KV does not fit"} for r in report["rows"]]
    png_size(Path(plots.plot_roofline(report, str(tmp_path / "r.png"))))
