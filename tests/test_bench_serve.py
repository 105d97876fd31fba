"""`roseinfer bench serve` (W8): the latency arithmetic on a scripted engine and clock, the sweep's stop rule, the
workload's draws, and one small run end to end on the built-in model (its report, table and plot)."""

from __future__ import annotations

import argparse
import json
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from triton import knobs

from roseinfer.bench import env, plots, serve
from roseinfer.entrypoints.cli import main
from roseinfer.sampling_params import RequestOutputKind
from tests.virtual_clock import VirtualClock


class ScriptedEngine:
    """Each step takes STEP s and gives every admitted request the next entry of its plan (tokens that step)."""

    STEP = 0.1

    def __init__(self, clock: VirtualClock, plans: dict[str, list[int]]) -> None:
        self.clock, self.plans = clock, plans
        self.config = SimpleNamespace(device=torch.device("cpu"))
        self.active: dict[str, list[int]] = {}
        self.arrivals: dict[str, float] = {}
        # The cache holds a tenth of its blocks per active request; each step preempts once while two run.
        self.core = SimpleNamespace(
            kv=SimpleNamespace(usage=lambda: 0.1 * len(self.active)),
            scheduler=SimpleNamespace(num_preemptions=3),
        )

    def add_request(self, prompt, params, request_id, arrival_time):
        self.active[request_id] = list(self.plans[request_id])
        self.arrivals[request_id] = arrival_time

    def has_unfinished_requests(self) -> bool:
        return bool(self.active)

    def step(self):
        self.clock.now += self.STEP
        self.core.scheduler.num_preemptions += len(self.active) > 1
        outs = []
        for rid in list(self.active):
            new = self.active[rid].pop(0)
            done = not self.active[rid]
            outs.append(
                SimpleNamespace(request_id=rid, outputs=[SimpleNamespace(token_ids=[7] * new)], finished=done)
            )
            if done:
                del self.active[rid]
        return outs


def test_latencies_on_a_scripted_engine(monkeypatch):
    clock = VirtualClock()
    monkeypatch.setattr(serve, "time", clock)
    # w8-0 arrives at once and gets 1, then 2 (a step of async scheduling), then 1 token; w8-1 arrives 0.25 s later
    # and gets its one token in the first step after it is added.
    engine = ScriptedEngine(clock, {"w8-0": [1, 2, 1], "w8-1": [1]})
    workload = serve.build_w8(500, 2, 1, prompt_len=3, output_len=4)
    result = serve.run_serving(engine, workload, np.array([0.0, 0.25]), 4.0, progress=False)
    start = 0.001  # the driver starts its clock 1 ms ahead
    assert engine.arrivals == pytest.approx({"w8-0": start, "w8-1": start + 0.25})
    assert result.ttft == pytest.approx([0.1, 0.15])  # w8-1 waits for w8-0's step in flight, then one step
    assert result.itl == pytest.approx([0.05, 0.05, 0.1])  # the two-token step's gap split between its tokens
    assert result.tpot == pytest.approx([0.2 / 3])  # w8-1's one token has no TPOT
    assert result.e2e == pytest.approx([0.3, 0.15])
    assert result.output_tokens == 5 and result.wall_s == pytest.approx(0.4)
    row = result.row()
    assert row["requests"] == 2 and row["achieved_req_s"] == pytest.approx(5.0)
    assert row["output_tok_s"] == pytest.approx(12.5)
    assert row["ttft_mean_ms"] == pytest.approx(125.0) and row["ttft_p50_ms"] == pytest.approx(125.0)
    assert row["itl_p50_ms"] == pytest.approx(50.0) and row["itl_p99_ms"] == pytest.approx(99.0)
    assert row["e2e_p99_ms"] == pytest.approx(298.5) and row["tpot_p95_ms"] == pytest.approx(200 / 3)
    # Never two at once here: w8-1 arrives after w8-0's last step; usage is read after each step.
    assert (row["preemptions"], row["kv_usage_max"]) == (0, pytest.approx(0.1))


def test_an_idle_driver_sleeps_until_the_next_arrival(monkeypatch):
    clock = VirtualClock()
    monkeypatch.setattr(serve, "time", clock)
    engine = ScriptedEngine(clock, {"w8-0": [1], "w8-1": [1]})
    workload = serve.build_w8(500, 2, 1, prompt_len=3, output_len=1)
    result = serve.run_serving(engine, workload, np.array([0.0, 2.0]), 0.5, progress=False)
    assert result.ttft == pytest.approx([0.1, 0.1]) and result.wall_s == pytest.approx(2.1)


def test_the_workload_draws():
    a, b = serve.build_w8(32000, 3, 1, seed=5), serve.build_w8(32000, 3, 1, seed=5)
    assert a.prompts == b.prompts and a.prompts != serve.build_w8(32000, 3, 2, seed=5).prompts
    assert a.prompts != serve.build_w8(32000, 3, 1, seed=6).prompts  # --seed draws other prompts
    assert all(len(p) == 512 and 1000 <= min(p) and max(p) < 32000 for p in a.prompts)
    assert all(
        (s.max_tokens, s.temperature, s.ignore_eos, s.output_kind)
        == (128, 0.0, True, RequestOutputKind.DELTA)
        for s in a.params
    )
    assert a.id == "W8" and a.scaled
    assert not serve.build_w8(32000, serve.W8_NUM_REQUESTS, 1).scaled


def test_the_sweep_doubles_and_stops_when_throughput_stops_growing():
    args = argparse.Namespace(rates=None, start_rate=8.0, max_rate=100.0)
    assert serve.sweep_rates(args) == [8.0, 16.0, 32.0, 64.0]
    args.max_rate = 64.0  # the last rate may be --max-rate itself
    assert serve.sweep_rates(args) == [8.0, 16.0, 32.0, 64.0]
    assert serve.sweep_rates(argparse.Namespace(rates=[3.0, 1.0], start_rate=8.0, max_rate=9.0)) == [3.0, 1.0]

    def rows(*tput: float) -> list[dict]:
        return [{"output_tok_s": t} for t in tput]

    assert not serve.saturated(rows(100.0))
    assert not serve.saturated(rows(100.0, 110.5))
    assert serve.saturated(rows(100.0, 109.5))
    assert serve.saturated(rows(100.0, float("nan")))


def test_a_small_run_end_to_end(tmp_path, capsys):
    path = tmp_path / "not" / "yet" / "serve.json"  # the report's folder is made
    argv = ["bench", "serve", "--num-requests", "6", "--prompt-len", "20", "--output-len", "5"]
    argv += ["--rates", "50,400", "--warmup-requests", "2", "--no-progress", "--json", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "# workload    : W8" in out and "=== W8 serve-random: 6 requests a rate" in out
    assert "saturation" not in out  # fixed rates: no sweep
    report = json.loads(path.read_text())
    assert report["header"]["scaled"] is True and report["saturated_at"] is None
    assert report["startup"]["seconds"] > 0 and "\nStart-up: " in out
    assert [r["rate"] for r in report["rows"]] == [50.0, 400.0]
    for row in report["rows"]:
        assert row["requests"] == 6
        assert row["output_tok_s"] * 6 / row["achieved_req_s"] == pytest.approx(
            6 * 5
        )  # every token came back
        assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] <= row["e2e_p99_ms"]
        assert row["itl_p50_ms"] > 0 and row["tpot_mean_ms"] > 0
    assert report["plots"]["W8"] == str(path.parent / "serve.W8.png")  # matplotlib is a dev extra
    assert (path.parent / "serve.W8.png").stat().st_size > 0
    assert plots.plot_report(report, str(tmp_path / "again")) == {"W8": str(tmp_path / "again.W8.png")}


def test_the_plot_leaves_out_an_infinite_rate(tmp_path):
    row = {f"{n}_{q}_ms": 1.0 for n in ("ttft", "tpot") for q in ("p50", "p99")} | {"output_tok_s": 5.0}
    report = {"header": {}, "rows": [row | {"rate": float("inf")}], "saturated_at": None}
    assert plots.plot_w8(report, str(tmp_path / "a.png")) is None
    report["rows"].append(row | {"rate": 4.0})
    made = plots.plot_w8(report, str(tmp_path / "new" / "b.png"))  # its folder made
    assert made == str(tmp_path / "new" / "b.png") and (tmp_path / "new" / "b.png").stat().st_size > 0


def test_a_report_goes_into_a_folder_made_for_it(tmp_path):
    path = tmp_path / "a" / "b" / "report.json"
    env.write_json_report(str(path), {"rows": [1.5, float("inf")]}, indent=1)
    assert json.loads(path.read_text()) == {"rows": [1.5, float("inf")]}
    assert path.read_text().startswith('{\n "rows"')  # indent 1


def test_preemptions_and_the_fullest_cache_of_a_rate(monkeypatch):
    clock = VirtualClock()
    monkeypatch.setattr(serve, "time", clock)
    engine = ScriptedEngine(clock, {"w8-0": [1, 1], "w8-1": [1, 1]})
    workload = serve.build_w8(500, 2, 1, prompt_len=3, output_len=2)
    row = serve.run_serving(engine, workload, np.array([0.0, 0.0]), 8.0, progress=False).row()
    # Two steps with both running: 2 preemptions past the 3 the engine had before; 0.2 after the first step.
    assert (row["preemptions"], row["kv_usage_max"]) == (2, pytest.approx(0.2))


def test_the_sweep_stops_at_saturation_then_sends_everything_at_once(monkeypatch, capsys):
    tput = {8.0: 100.0, 16.0: 190.0, 32.0: 200.0, 64.0: 400.0, math.inf: 250.0}
    calls = []

    def one_rate(engine, workload, rate, args, stream):
        calls.append((rate, stream, workload.prompts[0][:3]))
        return {"rate": rate, "output_tok_s": tput[rate]}

    monkeypatch.setattr(serve, "_one_rate", one_rate)
    monkeypatch.setattr(serve, "warm_up_online", lambda engine, warm: None)
    argv = ["--num-requests", "3", "--prompt-len", "4", "--output-len", "2", "--no-progress"]
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    report = serve.run_serve(parser.parse_args(argv))
    # 16 -> 32 grew 5%: saturated at 32, 64 never runs; then the burst, on a stream of its own.
    assert [(rate, stream) for rate, stream, _ in calls] == [(8.0, 1), (16.0, 2), (32.0, 3), (math.inf, 4)]
    assert len({tuple(head) for _, _, head in calls}) == 4  # each stream its own prompts
    assert report["saturated_at"] == 32.0 and [r["rate"] for r in report["rows"]] == [
        8.0,
        16.0,
        32.0,
        math.inf,
    ]
    out = capsys.readouterr().out
    assert "W8 saturation: output tok/s grew < 10% from 16 to 32 req/s" in out
    assert "W8 all at once (inf): 250 out tok/s; the best Poisson rate reached 80% of it" in out


def test_a_sweep_that_never_saturates_says_so(monkeypatch, capsys):
    monkeypatch.setattr(
        serve, "_one_rate", lambda engine, w, rate, args, s: {"rate": rate, "output_tok_s": min(rate, 99)}
    )
    monkeypatch.setattr(serve, "warm_up_online", lambda engine, warm: None)
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = [
        "--num-requests",
        "2",
        "--prompt-len",
        "4",
        "--output-len",
        "2",
        "--start-rate",
        "4",
        "--max-rate",
        "16",
    ]
    report = serve.run_serve(parser.parse_args(args))
    assert report["saturated_at"] is None and [r["rate"] for r in report["rows"]] == [
        4.0,
        8.0,
        16.0,
        math.inf,
    ]
    out = capsys.readouterr().out
    assert "W8 not saturated up to 16 req/s" in out and "reached 16% of it" in out


@pytest.mark.parametrize("seed", range(3))
def test_the_row_takes_numpys_mean_and_percentiles(seed):
    """As vLLM's benchmark: mean and linear-interpolated percentiles (np.mean, np.percentile) of each latency, in
    ms; achieved rates over the run's wall time."""
    rng = np.random.default_rng(seed)
    lists = {name: rng.exponential(0.05, size=int(rng.integers(3, 40))).tolist() for name in serve.LATENCIES}
    result = serve.ServeResult(
        4.0, **lists, wall_s=float(rng.uniform(1, 9)), output_tokens=int(rng.integers(50, 99))
    )
    row = result.row()
    for name, values in lists.items():
        assert row[f"{name}_mean_ms"] == pytest.approx(np.mean(values) * 1e3)
        for q in (50, 95, 99):
            assert row[f"{name}_p{q}_ms"] == pytest.approx(np.percentile(values, q) * 1e3)
    assert row["achieved_req_s"] == pytest.approx(len(lists["e2e"]) / result.wall_s)
    assert row["output_tok_s"] == pytest.approx(result.output_tokens / result.wall_s)


def test_the_defaults_are_w8s():
    """README: rates double from 8 req/s; WORKLOADS.md W8: 512 prompt tokens, 128 output tokens."""
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.start_rate, args.prompt_len, args.output_len, args.rates) == (8.0, 512, 128, None)


class FakeRuns:
    """Stands in for `run_serving` and the warm-up: records what each is given; a rate's output tok/s is
    `tput[rate]`, its latencies random."""

    def __init__(self, tput: dict[float, float], seed: int) -> None:
        self.tput, self.rng = tput, np.random.default_rng(seed)
        self.calls: list[tuple[float, list[list[int]], np.ndarray]] = []
        self.warm: list[list[list[int]]] = []
        self.rows: list[dict] = []

    def warm_up(self, engine, workload) -> None:
        assert not self.calls  # before the first rate
        self.warm.append(workload.prompts)

    def run(self, engine, workload, offsets, rate, desc="", progress=True) -> serve.ServeResult:
        self.calls.append((rate, workload.prompts, np.asarray(offsets)))
        draw = {name: self.rng.uniform(0.001, 3.0, size=20).tolist() for name in serve.LATENCIES}
        result = serve.ServeResult(rate, **draw, wall_s=1.0, output_tokens=int(self.tput[rate]))
        self.rows.append(result.row())
        return result


def run_with_fakes(monkeypatch, capsys, tput: dict[float, float], *flags: str) -> tuple[FakeRuns, dict, str]:
    fake = FakeRuns(tput, seed=len(flags))
    monkeypatch.setattr(serve, "run_serving", fake.run)
    monkeypatch.setattr(serve, "warm_up_online", fake.warm_up)
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    argv = ["--num-requests", "5", "--prompt-len", "6", "--output-len", "3", "--warmup-requests", "3"]
    args = parser.parse_args([*argv, "--no-progress", *flags])
    report = serve.run_serve(args)
    return fake, report, capsys.readouterr().out


def table(out: str) -> tuple[list[str], list[list[str]]]:
    """The W8 table's headings and cells."""
    lines = out[out.index("=== W8 serve-random") :].splitlines()
    rows = []
    for line in lines[3:]:
        if not line.strip() or line.startswith("W8 "):
            break
        rows.append(line.split())
    return re.split(r"\s{2,}", lines[1].strip()), rows


def test_the_sweep_stops_at_saturation_and_names_it(monkeypatch, capsys):
    tput = {1.0: 100.0, 2.0: 200.0, 4.0: 300.0, 8.0: 320.0, 16.0: 900.0, 32.0: 2000.0, math.inf: 500.0}
    fake, report, out = run_with_fakes(monkeypatch, capsys, tput, "--start-rate", "1", "--max-rate", "32")
    # 320 < 1.1 x 300: it stops at 8, then sends the same number of requests at once.
    assert [rate for rate, _, _ in fake.calls] == [1.0, 2.0, 4.0, 8.0, math.inf]
    assert report["saturated_at"] == 8.0 and report["workload"]["rates"] == [1.0, 2.0, 4.0, 8.0, math.inf]
    assert "W8 saturation: output tok/s grew < 10% from 4 to 8 req/s" in out
    # Each rate draws its own prompts and arrivals; the warm-up's prompts are none of them.
    prompts = [p for _, ps, _ in fake.calls for p in ps] + list(fake.warm[0])
    assert len(fake.warm) == 1 and len(fake.warm[0]) == 3
    assert len({tuple(p) for p in prompts}) == len(prompts) == 5 * 5 + 3
    assert not np.any(fake.calls[-1][2])  # all at once
    scaled = [offsets * rate for rate, _, offsets in fake.calls[:-1]]  # one stream would scale with the rate
    assert all(len(o) == 5 and o[0] == 0 and np.all(np.diff(o) > 0) for o in scaled)
    assert not any(np.allclose(a, b) for i, a in enumerate(scaled) for b in scaled[i + 1 :])
    # The table shows each row's numbers under their own headings.
    headings, cells = table(out)
    assert len(cells) == len(fake.rows) and all(len(c) == len(headings) for c in cells)
    names = set()
    for i, heading in enumerate(headings):
        if m := re.fullmatch(r"(TTFT|TPOT|ITL|E2E) (mean|p50|p95|p99) ms", heading):
            names.add(m[1])
            key = f"{m[1].lower()}_{m[2]}_ms"
            assert all(abs(float(c[i]) - r[key]) <= 0.5 for c, r in zip(cells, fake.rows)), heading
    assert names == {"TTFT", "TPOT", "ITL", "E2E"}


def test_fixed_rates_all_run_though_throughput_stops_growing(monkeypatch, capsys):
    tput = dict.fromkeys((3.0, 1.0, 2.0, 5.0), 100.0)
    fake, report, out = run_with_fakes(monkeypatch, capsys, tput, "--rates", "3,1,2,5")
    assert [rate for rate, _, _ in fake.calls] == [3.0, 1.0, 2.0, 5.0]
    assert report["saturated_at"] is None and report["workload"]["rates"] == [3.0, 1.0, 2.0, 5.0]
    assert "saturat" not in out


class StallingEngine(ScriptedEngine):
    """Its second step compiles a kernel variant and takes 1 s more."""

    def __init__(self, clock: VirtualClock, plans: dict[str, list[int]]) -> None:
        super().__init__(clock, plans)
        self.steps = 0

    def step(self):
        self.steps += 1
        if self.steps == 2:
            knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="_prefill_kernel"))
            self.clock.now += 1.0
        return super().step()


def test_a_stall_shows_as_the_longest_step_and_a_compile(monkeypatch):
    clock = VirtualClock()
    monkeypatch.setattr(serve, "time", clock)
    engine = StallingEngine(clock, {"w8-0": [1, 1, 1]})
    workload = serve.build_w8(500, 1, 1, prompt_len=3, output_len=3)
    row = serve.run_serving(engine, workload, np.array([0.0]), 1.0, progress=False).row()
    assert row["max_step_ms"] == pytest.approx(1100.0) and row["compiles"] == 1
    calm = serve.run_serving(
        ScriptedEngine(clock, {"w8-0": [1, 1]}), workload, np.array([0.0]), 1.0, progress=False
    )
    assert (calm.row()["max_step_ms"], calm.row()["compiles"]) == (pytest.approx(100.0), 0)
