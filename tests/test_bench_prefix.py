"""`roseinfer bench prefix`: every workload (W4, W3 online, W5, cow-micro, W2) on the CPU with the tiny-llama
shape and tiny sizes; the tables, the JSON report, and what the cache must change (prompt tokens computed,
cached tokens, copy-on-write copies), plus the pieces the command is built from."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from roseinfer.bench import (
    engine_probe,
    plots,
    prefix,
    prefix_common,
    prefix_cow_micro,
    prefix_online,
)
from roseinfer.bench.env import device_name
from roseinfer.bench.workloads import build_workload
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints import arg_types
from roseinfer.entrypoints.cli import BENCH_COMMANDS, main
from roseinfer.entrypoints.llm import make_engine_config

RATES = (50.0, 400.0)
ARGV = [
    "bench", "prefix", "--model-shape", "tiny-llama", "--workload", "all",
    "--num-requests", "4", "--max-prompt-len", "70", "--max-output-len", "3",
    "--max-num-batched-tokens", "96", "--warmup-requests", "1", "--rates", ",".join(map(str, RATES)),
    # Two waves of W5: the second hits the first's shared partial block and copies it.
    "--max-num-seqs", "2",
    "--cow-blocks", "4", "--cow-iters", "3", "--repeats", "1", "--no-progress",
]  # fmt: skip


@pytest.fixture(scope="module")
def run_all(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any], Path]:
    """The whole command, once: (stdout, the JSON report, its path)."""
    out_json = tmp_path_factory.mktemp("prefix") / "report.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main([*ARGV, "--json", str(out_json)]) == 0
    return buf.getvalue(), json.loads(out_json.read_text()), out_json


def table(text: str, title_prefix: str) -> list[dict[str, str]]:
    """The rows of the `=== title_prefix... ===` table, as {heading: cell}."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"=== {title_prefix}"))
    headings = re.split(r"\s{2,}", lines[start + 1].strip())
    assert set(lines[start + 2]) == {"-"}
    rows = []
    for line in lines[start + 3 :]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(headings):
            break
        rows.append(dict(zip(headings, cells)))
    return rows


def by(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    (row,) = [r for r in rows if all(r[k] == v for k, v in match.items())]
    return row


# -- the command, end to end -----------------------------------------------------------------------


def test_registered_and_header(run_all):
    assert BENCH_COMMANDS["prefix"][0] == "roseinfer.bench.prefix"
    text, report, _ = run_all
    for key, value in {
        "workload": "W4,W3,W5,cow-micro,W2",
        "model_shape": "tiny-llama",
        "device": device_name(),
        "command": "roseinfer bench prefix --model-shape tiny-llama --workload all",
        "scaled": "True",
    }.items():
        assert re.search(rf"^# {key}\s*: {re.escape(value)}", text, re.M), f"header lacks {key}"
    assert report["header"]["workload"] == "W4,W3,W5,cow-micro,W2"
    assert set(report["results"]) == {"W4", "W3", "W5", "cow-micro", "W2"}
    assert Path(report["plots"]["W3"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # matplotlib: a dev extra


def test_w4_cache_on_computes_fewer_prompt_tokens(run_all):
    text, report, _ = run_all
    rows = table(text, "W4 repeated prompt")
    assert [(r["mode"], r["cache"]) for r in rows] == [
        (m, c) for m in ("naive", "static", "continuous") for c in ("off", "on")
    ]
    for r in rows:
        assert float(r["prefill s"]) > 0 and float(r["total s"]) > 0 and float(r["out tok/s"]) > 0
    prompt_tokens = 4 * 70
    saved = report["results"]["W4"]["rows"]
    for mode in ("naive", "static", "continuous"):
        off, on = by(saved, mode=mode, cache="off"), by(saved, mode=mode, cache="on")
        assert off["prompt_tokens_computed"] == prompt_tokens and off["hit_rate"] == 0.0
        assert on["prompt_tokens_computed"] <= off["prompt_tokens_computed"]
        assert int(by(rows, mode=mode, cache="on")["prompt tok computed"]) == on["prompt_tokens_computed"]
        assert on["prefill_s"] + on["decode_s"] == pytest.approx(on["total_s"])
    # One request at a time: every request after the first finds the whole prompt (the last token is
    # recomputed for its logits). A static batch is admitted whole before anything is cached.
    assert by(saved, mode="naive", cache="on")["prompt_tokens_computed"] == 70 + 3
    assert by(saved, mode="continuous", cache="on")["prompt_tokens_computed"] < prompt_tokens
    assert by(saved, mode="continuous", cache="on")["hit_rate"] > 0
    assert "W4 continuous: prefill" in text


def test_w3_online_hits_the_shared_prefix(run_all):
    text, report, _ = run_all
    rows = table(text, "W3 shared prefix, online")
    assert [(float(r["rate req/s"]), r["cache"]) for r in rows] == [
        (rate, c) for rate in RATES for c in ("off", "on")
    ]
    w3 = report["results"]["W3"]
    assert w3["workload"]["rates"] == list(RATES)
    for r in w3["rows"]:
        assert r["requests"] == 4
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"]
        assert r["ttft_p99_ms"] / 1e3 <= r["e2e_p99_s"]
        if r["cache"] == "on":  # 63-token shared prefix: its 3 full blocks come from the cache
            assert r["cached_tokens_min"] == 48
        else:
            assert r["cached_tokens_mean"] == 0
    best = w3["max_rate_under_slo"]
    for cache in ("off", "on"):
        assert best[cache] == prefix_online.max_rate_under_slo([r for r in w3["rows"] if r["cache"] == cache])
    assert "W3 max rate with p99 E2E <= 2 s" in text


def test_w5_copy_on_write_stays_batched(run_all):
    text, report, _ = run_all
    rows = table(text, "W5 copy-on-write")
    assert [r["cache"] for r in rows] == ["off", "on"]
    off, on = (by(report["results"]["W5"]["rows"], cache=c) for c in ("off", "on"))
    for r in (off, on):
        assert r["completion_tokens"] == 4 * 2
        assert r["ttft_p50_ms"] > 0 and r["itl_p50_ms"] > 0 and r["output_tok_s"] > 0
    assert off["cow_copies"] == 0 and off["copy_launches"] == 0
    assert on["cow_copies"] > 0 and on["copy_launches"] <= on["cow_copies"]
    assert on["prompt_tokens_computed"] < off["prompt_tokens_computed"] == 4 * 65  # W5: 65-token prompts


def test_cow_micro(run_all):
    text, report, _ = run_all
    rows = table(text, "cow-micro")
    # The engine runs where the bench does: on a GPU the Triton backend, and the Triton kernel beside it.
    on_device = (
        ["triton backend.copy_blocks", "triton kernels.block_copy"]
        if torch.cuda.is_available()
        else ["torch backend.copy_blocks"]
    )
    want = [f"{name} (indices on device)" for name in on_device] + ["runner.copy_blocks (indices uploaded)"]
    assert [r["path"] for r in rows] == want
    cow = report["results"]["cow-micro"]
    assert cow["identical"] is True and cow["num_copies"] == 4 and cow["block_size"] == 64
    for r in cow["rows"]:
        assert r["batched_us"] > 0 and r["looped_us"] > 0
    assert "batched copy leaves the cache identical to the looped copy: True" in text


def test_w2_overhead(run_all):
    text, report, _ = run_all
    rows = table(text, "W2 mixed, cache overhead")
    assert [r["cache"] for r in rows] == ["off", "on"]
    w2 = report["results"]["W2"]
    assert all(r["hit_rate"] == 0.0 for r in w2["rows"])  # random prompts: nothing to reuse
    assert math.isfinite(w2["relative_diff"])
    assert "W2 relative throughput, cache on vs off:" in text


# -- the pieces ------------------------------------------------------------------------------------


def tiny_engine(**kw: Any) -> LLMEngine:
    config, path = make_engine_config("tiny-llama", load_format="dummy", **kw)
    return LLMEngine(config, path)


def test_batched_copy_equals_looped_copy():
    engine = tiny_engine(num_kv_blocks=16)
    copy_fn = engine.core.runner.backend.copy_blocks
    kv = engine.core.runner.kv_cache
    assert kv is not None
    pairs = [(3, 9), (0, 12), (7, 1), (5, 4)]
    assert prefix_cow_micro.check_batched_equals_looped(copy_fn, kv, pairs)

    def broken(cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        cache[dst[:1]] = cache[src[:1]]  # drops every pair but the first

    assert not prefix_cow_micro.check_batched_equals_looped(broken, kv, pairs)
    with pytest.raises(ValueError, match="distinct blocks"):
        prefix_cow_micro.cow_pairs(16, 9)


def test_probe_counts_prompt_tokens_of_full_hits():
    """A request whose whole prompt is cached still computes its last token; the probe counts it."""
    engine = tiny_engine(scheduler_mode="naive")
    probe = engine_probe.Probe(engine)
    wl = build_workload("W4", 32000, num_requests=3, max_prompt_len=48, max_output_len=3)
    for p, s in zip(wl.prompts, wl.params):
        engine.add_request(p, s)
    while engine.has_unfinished_requests():
        engine.step()
    assert probe.prompt_tokens_computed == 48 + 1 + 1
    # A hit counts the tokens served from the cache, as num_cached_tokens does: hits and computed add up.
    assert probe.prefill_steps == 3 and probe.hit_tokens == 2 * 47
    assert probe.hit_tokens + probe.prompt_tokens_computed == probe.queried_tokens == 3 * 48
    assert probe.copies == 2 and probe.copy_launches == 2  # the cached last block, copied on write


def test_w3_workload_shape_and_arrivals():
    assert prefix_online.w3_lengths(None, None) == (900, 100, 30)
    assert prefix_online.w3_lengths(100, 5) == (90, 10, 5)
    a = prefix_online.build_w3(32000, 5, 1, prefix_len=20, suffix_len=6, output_len=2)
    b = prefix_online.build_w3(32000, 5, 2, prefix_len=20, suffix_len=6, output_len=2)
    assert a.scaled and a.num_requests == 5 and set(a.prompt_lens) == {26} and set(a.output_lens) == {2}
    assert all(p[:20] == a.prompts[0][:20] == b.prompts[0][:20] for p in a.prompts + b.prompts)
    suffixes = {tuple(p[20:]) for p in a.prompts + b.prompts}
    assert len(suffixes) == 10  # unique per request and per stream
    assert a.prompts == prefix_online.build_w3(32000, 5, 1, prefix_len=20, suffix_len=6, output_len=2).prompts
    full = prefix_online.build_w3(32000, 200, 1)
    assert not full.scaled and set(full.prompt_lens) == {1000}
    offsets = prefix_online.poisson_offsets(2000, 8.0, 0, 1)
    assert offsets[0] == 0 and np.all(np.diff(offsets) >= 0)
    assert np.diff(offsets).mean() == pytest.approx(1 / 8, rel=0.1)
    assert np.array_equal(offsets, prefix_online.poisson_offsets(2000, 8.0, 0, 1))


def test_helpers():
    assert arg_types.arrival_rates("1,2, 4") == [1.0, 2.0, 4.0]
    assert arg_types.arrival_rates("8 inf") == [8.0, float("inf")]  # inf: every request at once
    for bad in ("1,0", "nan", "-1", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="positive"):
            arg_types.arrival_rates(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated numbers"):
        arg_types.arrival_rates("1,x")
    assert prefix.parse_workload("w3") == "W3"
    assert prefix.parse_workload("COW-micro") == "cow-micro"
    assert prefix.parse_workload("ALL") == "all"
    with pytest.raises(Exception, match="unknown workload"):
        prefix.parse_workload("W9")
    rows = [{"rate": 1.0, "slo_ok": True}, {"rate": 4.0, "slo_ok": True}, {"rate": 8.0, "slo_ok": False}]
    assert prefix_online.max_rate_under_slo(rows) == 4.0
    assert prefix_online.max_rate_under_slo(rows[2:]) is None
    text = prefix_common.format_table("t", [("a", "A", "d"), ("b", "Bee", ".1f")], [{"a": 1, "b": None}])
    assert text.splitlines()[1:] == ["A  Bee", "------", "1    -"]
    assert prefix_common.percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert math.isnan(prefix_common.percentile([], 50))


def test_plot_is_skipped_quietly_without_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    rows = [{"rate": 1.0, "cache": c, "ttft_p99_ms": 1.0, "e2e_p99_s": 0.1} for c in ("off", "on")]
    w3 = {"workload": {"slo_p99_s": 2.0}, "rows": rows}
    assert plots.plot_w3(w3, str(tmp_path / "x.png")) is None
    assert not (tmp_path / "x.png").exists()


def test_the_max_rate_under_the_slo_is_the_highest_one_every_lower_rate_also_met():
    def rows(*oks: bool) -> list[dict[str, Any]]:
        return [{"rate": r, "slo_ok": ok} for r, ok in zip((4.0, 1.0, 2.0, 8.0), oks)]

    assert (
        prefix_online.max_rate_under_slo(rows(True, True, False, True)) == 1.0
    )  # 2 req/s failed: 4 is not sustained
    assert prefix_online.max_rate_under_slo(rows(True, True, True, False)) == 4.0
    assert prefix_online.max_rate_under_slo(rows(True, False, True, True)) is None
