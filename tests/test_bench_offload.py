"""`roseinfer bench offload` on the CPU, shrunk: every configuration's rows, loads only where a CPU tier serves
them, the report's tables and plots, and bad options refused."""

from __future__ import annotations

import json

import pytest

from roseinfer.bench import offload
from roseinfer.bench.plots import plot_report, pyplot
from roseinfer.entrypoints.cli import build_parser


def args(tmp_path, *extra: str):
    argv = ["bench", "offload", "--model-shape", "tiny-llama", "--num-requests", "4", "--prompt-len", "40"]
    argv += [
        "--output-len",
        "2",
        "--kv-offloading-size",
        "0.01",
        "--no-progress",
        "--json",
        str(tmp_path / "r.json"),
    ]
    return build_parser().parse_args(argv + list(extra))


def test_both_workloads_every_configuration(tmp_path, capsys) -> None:
    a = args(tmp_path, "--hit-rates", "0,1", "--outputs", "2")
    offload.check_arguments(a)
    report = offload.run_offload(a)
    text = capsys.readouterr().out
    assert "== W6 hit-rate sweep" in text and "== W7 long-prompt rounds" in text and "# scaled" in text
    w6, w7 = report["results"]["W6"], report["results"]["W7"]
    assert list(w6) == list(w7) == list(offload.CONFIGS)
    for name, rows in w6.items():
        assert [r["h"] for r in rows] == [0.0, 1.0]
        whole = rows[1]
        # A whole-prompt hit leaves the last token to compute; the CPU tier holds full blocks only.
        assert whole["hit_tokens"] == {"none": 0, "gpu": 4 * 39, "gpu+cpu": 4 * 39, "cpu": 4 * 32}[name]
        assert (whole["loaded_tokens"] > 0) == (name == "cpu")  # the GPU cache keeps everything in gpu+cpu
        assert rows[0]["loaded_tokens"] == 0 and rows[0]["hit_tokens"] == 0  # h = 0: nothing seen before
    assert (
        w6["cpu"][1]["hit_tokens"] == w6["cpu"][1]["loaded_tokens"] == 4 * 32
    )  # full blocks short of the last
    for name, rows in w7.items():
        assert [(r["N"], r["round"]) for r in rows] == [(2, 1), (2, 2), (2, 3)]
        assert rows[0]["loaded_tokens"] == 0  # round 1 computes
        assert all((r["loaded_tokens"] > 0) == (name == "cpu") for r in rows[1:])
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["results"]["W6"]["cpu"][1]["loaded_tokens"] == 128
    assert saved["info"]["cpu_blocks"]["none"] == 0 and saved["info"]["cpu_blocks"]["cpu"] > 0
    for w in ("W6", "W7"):  # every configuration's warm-up, timed, with its compiles (none on the CPU)
        warm = saved["info"]["warm_up"][w]
        assert list(warm) == list(offload.CONFIGS)
        assert all(
            v["seconds"] > 0 and v["triton_compiles"] == {} and v["variants"] == [] for v in warm.values()
        )
    assert text.count("W7 warm-up in") == text.count("W7 timed runs in") == len(offload.CONFIGS)
    first = [r["req_per_s"] for r in w7["none"]]  # each configuration's rates as soon as it is done
    assert "# none: W7 timed runs in " in text and ("; req/s " + ", ".join(f"{x:.2f}" for x in first)) in text
    if pyplot() is not None:
        assert set(report["plots"]) == {"W6", "W7"}
        again = plot_report(saved, str(tmp_path / "again"))  # `bench plot` redraws the saved report
        assert again == {w: str(tmp_path / f"again.{w}.png") for w in ("W6", "W7")}
        assert all((tmp_path / f"again.{w}.png").stat().st_size > 0 for w in ("W6", "W7"))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--configs", "gpu,disk"], "unknown"),
        (["--hit-rates", "0.5,1.5"], "hit-rates"),
        (["--outputs", "0"], "outputs"),
        (["--kv-offloading-size", "0"], "kv-offloading-size"),
    ],
)
def test_bad_options(tmp_path, extra: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        offload.check_arguments(args(tmp_path, *extra))


@pytest.mark.parametrize(
    ("workload", "num_requests", "expected"),
    [("W7", None, 10), ("W6", None, 256), ("W7", 3, 3), ("W6", 300, 256)],
)
def test_the_warm_up_runs_the_workloads_own_request_count_up_to_256(
    monkeypatch, workload: str, num_requests: int | None, expected: int
) -> None:
    """W7's warm-up runs its 10 prompts: with W6's default count it ran 256 of 10240 tokens, more than the GPU
    cache holds for llama-3.1-8b, for a hundred times the timed rounds' time."""
    seen = []

    def record(engine, a, vocab, progress):
        seen.append((a.num_requests, a.seed, a.outputs, a.hit_rates))
        return []

    monkeypatch.setattr(offload, "bench_w6" if workload == "W6" else "bench_w7", record)
    a = build_parser().parse_args(["bench", "offload", "--workload", workload, "--seed", "5"])
    a.num_requests = num_requests
    offload.warm_up(None, workload, a, 1000)
    assert seen == [
        (expected, 1005, [2], [0.5, 1.0])
    ]  # other tokens than the timed runs', the shapes they meet
    assert a.num_requests == num_requests  # the caller's options untouched


def test_a_run_cut_short_leaves_the_finished_configurations_in_the_json(tmp_path, monkeypatch) -> None:
    real, calls = offload.bench_w7, []

    def fails_on_the_second_timed_run(engine, a, vocab, progress):
        if a.seed == 0:  # the timed runs' seed (the warm-up's is offset)
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt  # what a time limit does to a run in the middle
        return real(engine, a, vocab, progress)

    monkeypatch.setattr(offload, "bench_w7", fails_on_the_second_timed_run)
    a = args(tmp_path, "--workload", "W7", "--outputs", "2", "--configs", "gpu,cpu", "--seed", "0")
    with pytest.raises(KeyboardInterrupt):
        offload.run_offload(a)
    saved = json.loads((tmp_path / "r.json").read_text())
    assert list(saved["results"]["W7"]) == ["gpu"] and len(saved["results"]["W7"]["gpu"]) == 3
    assert saved["info"]["warm_up"]["W7"]["cpu"]["seconds"] > 0  # its warm-up finished before the cut


def test_profile_traces_the_first_output_lengths_rounds_and_the_first_and_last_h(tmp_path, capsys) -> None:
    trace = tmp_path / "t" / "trace.json"
    a = args(
        tmp_path,
        "--configs",
        "gpu+cpu",
        "--outputs",
        "2,3",
        "--hit-rates",
        "0,0.5,1",
        "--profile",
        str(trace),
    )
    offload.check_arguments(a)
    offload.run_offload(a)
    written = sorted(p.name for p in (tmp_path / "t").iterdir())
    w7 = [f"trace.gpu_cpu.W7.N2.r{r}.json" for r in (1, 2, 3)]
    assert written == sorted(["trace.gpu_cpu.W6.h0.json", "trace.gpu_cpu.W6.h1.json", *w7])
    events = json.loads((tmp_path / "t" / "trace.gpu_cpu.W7.N2.r2.json").read_text())["traceEvents"]
    assert sum(e.get("name") == "step" for e in events) >= 2  # the engine's ranges: a whole hit, then decodes
    assert capsys.readouterr().out.count("[profile] wrote:") == 5
