"""`roseinfer bench decode`: the window's arithmetic on a virtual clock, the rows on the CPU engine, and `--peer vllm`
against a stand-in `vllm` package whose generate takes a scripted time a token (the real one runs only on the GPU
machine): the peer gets roseinfer's limits and the very prompts, and its step time lands beside roseinfer's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from roseinfer.bench import decode_steps, plots
from roseinfer.bench.decode_steps import (
    Window,
    add_floors,
    check_lengths,
    join_peer,
    time_window,
    window_prompts,
)
from roseinfer.entrypoints.cli import main
from tests.fake_vllm import GENERATE_PRELUDE, REPO, entries, install_fake_vllm

BASE_S = 0.030  # the stand-in's time for a generate call, plus
STEP_S = 0.006  # this much a token of output

FAKE = {
    "vllm/__init__.py": GENERATE_PRELUDE
    + """
BASE_S, STEP_S = float(os.environ["FAKE_VLLM_BASE_S"]), float(os.environ["FAKE_VLLM_STEP_S"])

class _Out:
    def __init__(self, n):
        self.outputs = [type("C", (), {"token_ids": [7] * n})()]

class LLM:
    def __init__(self, **kw):
        if os.environ.get("FAKE_VLLM_FAIL"):
            raise RuntimeError("stand-in engine refuses to start")
        with open(os.path.join(kw["model"], "config.json")) as f:
            log(kind="engine", args=kw, config=json.load(f))

    def generate(self, prompts, params, use_tqdm=True):
        log(kind="generate", prompts=[p["prompt_token_ids"] for p in prompts], params=params.kw, tqdm=use_tqdm)
        n = params.kw["max_tokens"]
        time.sleep(BASE_S + STEP_S * n)
        return [_Out(n) for _ in prompts]
""",
}


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return install_fake_vllm(tmp_path, monkeypatch, FAKE, base_s=BASE_S, step_s=STEP_S)


def test_the_window_centres_its_steps_on_the_context():
    w = Window(32, 160)
    assert w.steps == 128 and w.prompt_len(1024) == 928  # steps attend over 960..1087 tokens
    assert Window(3, 8).prompt_len(20) == 15
    for short, long in ((0, 5), (5, 5), (6, 5)):
        with pytest.raises(ValueError, match="short < long"):
            Window(short, long)
    with pytest.raises(ValueError, match="context 90 leaves no prompt"):
        Window(32, 160).prompt_len(90)


def test_the_step_is_the_difference_of_the_two_runs_over_their_steps():
    now = [0.0]
    calls: list[int] = []
    noise = iter([0.0, 0.5, 0.0, 0.2, 0.1, 0.1, 0.0])  # the warm-up, then short/long pairs

    def generate(prompts, n):
        calls.append(n)
        now[0] += 2.0 + 0.25 * n + next(noise)

    row = time_window(generate, [[1, 2]], Window(4, 12), repeats=3, clock=lambda: now[0])
    assert calls == [12, 4, 12, 4, 12, 4, 12]  # a long warm-up, then alternating
    # short runs 3.5, 3.2, 3.1 and long runs 5.0, 5.1, 5.0: medians
    assert row["short_s"] == pytest.approx(3.2) and row["long_s"] == pytest.approx(5.0)
    assert row["step_ms"] == pytest.approx((5.0 - 3.2) / 8 * 1e3)
    assert row["long_spread_s"] == pytest.approx(0.1)


def test_prompts_follow_the_workloads_draw_and_the_seed():
    a = window_prompts(151936, 3, 17, seed=0)
    assert len(a) == 3 and {len(p) for p in a} == {17}
    assert all(1000 <= t < 32000 for p in a for t in p)
    assert a == window_prompts(151936, 3, 17, seed=0) and a != window_prompts(151936, 3, 17, seed=1)
    assert all(0 <= t < 500 for p in window_prompts(500, 2, 9, seed=0) for t in p)  # a vocabulary under 1000


def test_floors_and_the_peer_divide_cell_by_cell():
    rows = [{"batch": 1, "context": 64, "step_ms": 2.0}, {"batch": 8, "context": 64, "step_ms": 4.0}]
    add_floors(rows, lambda batch, context: batch * context * 1e-6)
    assert [r["floor_ms"] for r in rows] == pytest.approx([0.064, 0.512])
    assert [r["x_floor"] for r in rows] == pytest.approx([2.0 / 0.064, 4.0 / 0.512])
    join_peer(rows, [{"batch": 8, "context": 64, "step_ms": 6.0}])
    assert "peer_step_ms" not in rows[0]  # the peer did not run this cell
    assert rows[1]["peer_step_ms"] == 6.0 and rows[1]["peer_over_ours"] == pytest.approx(1.5)
    assert rows[1]["peer_x_floor"] == pytest.approx(6.0 / 0.512)
    bare = [{"batch": 1, "context": 8, "step_ms": 2.0}]
    add_floors(bare, None)  # no floor off the GPU
    join_peer(bare, [{"batch": 1, "context": 8, "step_ms": 1.0}])
    assert "floor_ms" not in bare[0] and "peer_x_floor" not in bare[0] and bare[0]["peer_over_ours"] == 0.5


def test_a_run_cut_short_is_refused():
    check_lengths([5, 5], 5, "x")
    with pytest.raises(RuntimeError, match="vLLM: 1 outputs of 4 tokens, asked for 5"):
        check_lengths([5, 4], 5, "vLLM")


@pytest.mark.parametrize("text", ["", "0", "1,-2", "a"])
def test_bad_cell_lists_are_refused(text):
    with pytest.raises((argparse.ArgumentTypeError, ValueError)):
        decode_steps.int_list(text)


def decode_argv(path: Path, *extra: str) -> list[str]:
    argv = ["bench", "decode", "--model-shape", "tiny-llama", "--batches", "1,3", "--contexts", "20"]
    return argv + [
        "--short",
        "2",
        "--long",
        "6",
        "--repeats",
        "1",
        "--no-progress",
        "--json",
        str(path),
        *extra,
    ]


def test_bench_decode_times_roseinfers_steps_on_the_cpu(tmp_path, capsys):
    path = tmp_path / "decode.json"
    assert main(decode_argv(path)) == 0
    out = capsys.readouterr().out
    report = json.loads(path.read_text())
    assert report["header"]["workload"] == "decode-steps" and report["header"]["model_shape"] == "tiny-llama"
    rows = report["rows"]
    assert [(r["batch"], r["context"], r["prompt_len"]) for r in rows] == [(1, 20, 16), (3, 20, 16)]
    assert all(r["long_s"] > 0 and r["short_s"] > 0 for r in rows)
    assert all("floor_ms" not in r for r in rows)  # the floor needs a GPU's measured bandwidth
    assert "decode step, steady" in out and "4-step window" in out
    assert report["plots"] == {"decode": str(tmp_path / "decode.decode.png")}


def test_the_peer_runs_the_same_cells_under_roseinfers_limits(fake_vllm, tmp_path, capsys):
    path = tmp_path / "decode.json"
    assert main(decode_argv(path, "--peer", "vllm", "--max-num-batched-tokens", "300")) == 0
    out = capsys.readouterr().out
    (engine,) = entries(fake_vllm, "engine")
    args = engine["args"]
    assert (args["max_num_seqs"], args["max_num_batched_tokens"], args["enable_prefix_caching"]) == (
        3,
        300,
        False,
    )
    assert (args["load_format"], args["skip_tokenizer_init"]) == ("dummy", True)
    builtin = REPO / "roseinfer" / "models" / "configs" / "tiny-llama.json"
    assert engine["config"] == json.loads(builtin.read_text())

    calls = entries(fake_vllm, "generate")
    assert [c["params"]["max_tokens"] for c in calls] == [6, 2, 6] * 2  # per cell: warm-up, short, long
    assert all(
        c["params"]
        == {
            "temperature": 0.0,
            "max_tokens": c["params"]["max_tokens"],
            "ignore_eos": True,
            "detokenize": False,
        }
        and c["tqdm"] is False
        for c in calls
    )
    vocab = json.loads(builtin.read_text())["vocab_size"]
    assert calls[0]["prompts"] == window_prompts(vocab, 1, 16, seed=0)
    assert calls[3]["prompts"] == window_prompts(vocab, 3, 16, seed=0)

    report = json.loads(path.read_text())
    for row in report["rows"]:
        assert row["peer_step_ms"] == pytest.approx(STEP_S * 1e3, abs=2.0)
        assert row["peer_over_ours"] == pytest.approx(row["peer_step_ms"] / row["step_ms"])
    assert report["peer"]["version"] == "0.0-stand-in"
    assert "vLLM ms" in out and "vLLM / roseinfer" in out


def test_a_peer_that_fails_says_so_and_keeps_roseinfers_rows(fake_vllm, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    path = tmp_path / "decode.json"
    assert main(decode_argv(path, "--peer", "vllm")) == 1
    assert "the vLLM peer exited with 1" in capsys.readouterr().out
    report = json.loads(path.read_text())
    assert len(report["rows"]) == 2 and "error" in report["peer"]
    assert all("peer_step_ms" not in r for r in report["rows"])


def decode_report(floors: bool, peer: bool) -> dict:
    rows = []
    for context in (512, 1024):
        for batch in (1, 8, 64):
            row = {"batch": batch, "context": context, "step_ms": 1.0 + batch / 64}
            if floors:
                row |= {"floor_ms": 0.5, "x_floor": row["step_ms"] / 0.5}
            if peer:
                row |= {"peer_step_ms": 3.0}
                row |= {"peer_x_floor": 6.0} if floors else {}
            rows.append(row)
    return {
        "header": {"workload": "decode-steps", "model_shape": "m", "device": "d", "commit": "c"},
        "rows": rows,
    }


@pytest.mark.parametrize(("floors", "peer"), [(True, True), (True, False), (False, True), (False, False)])
def test_the_decode_plot_is_a_png(tmp_path, floors, peer):
    path = tmp_path / "d.png"
    assert plots.plot_decode(decode_report(floors, peer), str(path)) == str(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_plot_draws_a_saved_decode_report(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(decode_report(True, True)))
    assert main(["bench", "plot", str(path)]) == 0
    assert f"plot decode: {tmp_path / 'run.decode.png'}" in capsys.readouterr().out
    assert (tmp_path / "run.decode.png").exists()


def test_cells_the_window_cannot_time_are_refused():
    w = Window(32, 160)  # prompts of 928 tokens at context 1024
    decode_steps.check_cells([1, 64], [1024], w, 16384, True, num_blocks=10_000, block_size=16)
    with pytest.raises(
        ValueError, match=r"batch 256 at context 4096: its prefill takes 63 steps of 16384 tokens"
    ):
        decode_steps.check_cells([256], [4096], w, 16384, True, num_blocks=10**6, block_size=16)
    # unchunked, 928-token prompts go 2 a step under a 2048 budget: 32 steps for 64 of them
    with pytest.raises(ValueError, match="takes 32 steps"):
        decode_steps.check_cells([64], [1024], w, 2048, False, num_blocks=10**6, block_size=16)
    decode_steps.check_cells([62], [1024], w, 2048, False, num_blocks=10**6, block_size=16)  # 31 steps
    # each request holds ceil((928 + 160) / 16) = 68 blocks at its end
    decode_steps.check_cells([4], [1024], w, 16384, True, num_blocks=4 * 68, block_size=16)
    with pytest.raises(
        ValueError, match="batch 4 at context 1024 needs 272 KV blocks at once, the cache has 271"
    ):
        decode_steps.check_cells([4], [1024], w, 16384, True, num_blocks=4 * 68 - 1, block_size=16)


def test_bench_decode_refuses_a_window_its_prefill_outlasts(capsys):
    argv = ["bench", "decode", "--model-shape", "tiny-llama", "--batches", "4", "--contexts", "40"]
    argv += ["--short", "2", "--long", "6", "--max-num-batched-tokens", "32", "--no-progress"]
    assert main(argv) != 0
    assert "its prefill takes 5 steps of 32 tokens, not fewer than --short 2" in capsys.readouterr().err
