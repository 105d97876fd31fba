"""`bench serve --peer vllm` against a stand-in `vllm` package (the real one runs only on the GPU machine): the peer
process builds its engine under roseinfer's limits, sends W8's very prompts at their arrival times, stamps the
stand-in's scripted stream right, and the parent sets its rows beside roseinfer's; a peer that fails says so
without losing roseinfer's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from roseinfer.bench import plots, serve_vllm
from roseinfer.bench.prefix_online import poisson_offsets
from roseinfer.bench.serve_common import build_w8
from roseinfer.entrypoints.cli import main
from tests.fake_vllm import REPO, entries, install_fake_vllm

FIRST_S = 0.040  # the stand-in's delay to a request's first token
NEXT_S = 0.010  # and between its later tokens

# A stand-in for the parts of vLLM the peer touches. It logs the engine's arguments, and per request the time
# `generate` was called (time.monotonic, one clock for both processes' readers here: the peer's stamps come from
# the same host clock), its prompt and its sampling parameters; it streams one token per output.
FAKE = {
    "vllm/__init__.py": """
__version__ = "0.0-stand-in"
class SamplingParams:
    def __init__(self, **kw):
        self.kw = kw
""",
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": """
class AsyncEngineArgs:
    def __init__(self, **kw):
        self.kw = kw
""",
    "vllm/sampling_params.py": """
import enum
class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2
""",
    "vllm/v1/__init__.py": "",
    "vllm/v1/engine/__init__.py": "",
    "vllm/v1/engine/async_llm.py": """
import asyncio, json, os, time
from types import SimpleNamespace
from vllm.sampling_params import RequestOutputKind
LOG = os.environ["FAKE_VLLM_LOG"]
FIRST_S, NEXT_S = float(os.environ["FAKE_VLLM_FIRST_S"]), float(os.environ["FAKE_VLLM_NEXT_S"])

def log(**entry):
    with open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\\n")

class AsyncLLM:
    @classmethod
    def from_engine_args(cls, args):
        if os.environ.get("FAKE_VLLM_FAIL"):
            raise RuntimeError("stand-in engine refuses to start")
        with open(os.path.join(args.kw["model"], "config.json")) as f:
            log(kind="engine", args=args.kw, config=json.load(f))
        return cls()

    async def generate(self, prompt, sampling_params, request_id):
        kw = sampling_params.kw
        log(kind="request", id=request_id, t=time.monotonic(), prompt=prompt["prompt_token_ids"],
            params={k: (v.name if isinstance(v, RequestOutputKind) else v) for k, v in kw.items()})
        n = kw["max_tokens"]
        for i in range(n):
            await asyncio.sleep(FIRST_S if i == 0 else NEXT_S)
            if kw["output_kind"] is RequestOutputKind.DELTA or i == n - 1:
                ids = [5] if kw["output_kind"] is RequestOutputKind.DELTA else [5] * n
                yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids)], finished=i == n - 1)

    def shutdown(self):
        log(kind="shutdown")
""",
}


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return install_fake_vllm(tmp_path, monkeypatch, FAKE, first_s=FIRST_S, next_s=NEXT_S)


def test_the_peer_sends_w8s_requests_at_their_arrivals_and_stamps_its_stream(fake_vllm, tmp_path):
    n, prompt_len, output_len, vocab, rate, seed = 5, 9, 4, 3000, 10.0, 3
    out = tmp_path / "peer.json"
    argv = ["--model", "tiny-llama", "--rates", f"{rate},inf", "--num-requests", str(n)]
    argv += ["--prompt-len", str(prompt_len), "--output-len", str(output_len), "--warmup-requests", "3"]
    argv += ["--seed", str(seed), "--vocab-size", str(vocab), "--max-num-seqs", "7"]
    argv += [
        "--max-num-batched-tokens",
        "300",
        "--gpu-memory-utilization",
        "0.8",
        "--no-enable-prefix-caching",
    ]
    argv += ["--block-size", "32", "--kv-cache-dtype", "fp8", "--json", str(out), "--no-progress"]
    run = subprocess.run(
        [sys.executable, "-m", "roseinfer.bench.serve_vllm", *argv], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "vLLM 0.0-stand-in, W8" in run.stdout

    (engine,) = entries(fake_vllm, "engine")
    args = engine["args"]
    assert (args["max_num_seqs"], args["max_num_batched_tokens"], args["gpu_memory_utilization"]) == (
        7,
        300,
        0.8,
    )
    assert (args["enable_prefix_caching"], args["block_size"], args["kv_cache_dtype"]) == (False, 32, "fp8")
    assert (args["load_format"], args["skip_tokenizer_init"], args["seed"]) == ("dummy", True, seed)
    builtin = REPO / "roseinfer" / "models" / "configs" / "tiny-llama.json"
    assert engine["config"] == json.loads(
        builtin.read_text()
    )  # the shape's config, in a directory of its own
    assert not Path(args["model"]).exists() and len(entries(fake_vllm, "shutdown")) == 1

    requests = entries(fake_vllm, "request")
    warm, timed = requests[:3], requests[3:]
    assert [r["prompt"] for r in warm] == build_w8(vocab, 3, 0, prompt_len=prompt_len, seed=seed).prompts
    assert all(r["params"]["output_kind"] == "FINAL_ONLY" for r in warm)
    report = json.loads(out.read_text())
    for k, rate_k in enumerate((rate, float("inf")), start=1):
        mine = [r for r in timed if r["id"].startswith(f"w8-{k}-")]
        mine.sort(key=lambda r: int(r["id"].rsplit("-", 1)[1]))
        assert [r["prompt"] for r in mine] == build_w8(vocab, n, k, prompt_len=prompt_len, seed=seed).prompts
        assert all(r["params"] == mine[0]["params"] for r in mine)
        assert mine[0]["params"] | {"output_kind": None} == {
            "temperature": 0.0,
            "max_tokens": output_len,
            "ignore_eos": True,
            "detokenize": False,
            "output_kind": None,
        }
        assert mine[0]["params"]["output_kind"] == "DELTA"
        sent = [r["t"] - mine[0]["t"] for r in mine]
        assert sent == pytest.approx(poisson_offsets(n, rate_k, seed, k).tolist(), abs=0.03)

        row = report["rows"][k - 1]
        assert row["rate"] == rate_k and row["requests"] == n
        assert row["ttft_p50_ms"] == pytest.approx(FIRST_S * 1e3, abs=25)
        assert row["tpot_p50_ms"] == pytest.approx(NEXT_S * 1e3, abs=10)
        assert row["itl_p50_ms"] == pytest.approx(NEXT_S * 1e3, abs=10)
        assert row["output_tok_s"] * n / row["achieved_req_s"] == pytest.approx(n * output_len)
        assert row["compiles"] is None and row["preemptions"] is None  # roseinfer's engine-side columns


def serve_argv(path: Path) -> list[str]:
    argv = [
        "bench",
        "serve",
        "--num-requests",
        "4",
        "--prompt-len",
        "12",
        "--output-len",
        "3",
        "--rates",
        "40",
    ]
    return argv + [
        "--warmup-requests",
        "2",
        "--no-progress",
        "--max-num-seqs",
        "5",
        "--peer",
        "vllm",
        "--json",
        str(path),
    ]


def test_bench_serve_sets_the_peers_rows_beside_its_own(fake_vllm, tmp_path, capsys):
    path = tmp_path / "serve.json"
    assert main(serve_argv(path)) == 0
    out = capsys.readouterr().out
    report = json.loads(path.read_text())
    ours, theirs = report["rows"][0], report["peer"]["rows"][0]
    assert theirs["rate"] == 40.0 and theirs["requests"] == 4
    (engine,) = entries(fake_vllm, "engine")
    assert engine["args"]["max_num_seqs"] == 5 and engine["args"]["enable_prefix_caching"] is True
    assert "W8 beside vLLM 0.0-stand-in" in out
    table = out[out.index("W8 beside vLLM") :].splitlines()
    cells = {line.split()[1]: line.split() for line in table if line.split()[:1] == ["40"]}
    mine, peer = cells["roseinfer"], cells["vLLM"]
    assert mine[3] == f"{ours['output_tok_s'] / theirs['output_tok_s']:.2f}"  # rate, engine, tok/s, x vLLM
    assert peer[2] == f"{theirs['output_tok_s']:.0f}" and peer[3] == "-"
    assert plots.plot_w8(report, str(tmp_path / "both.png")) == str(tmp_path / "both.png")


def test_a_peer_that_fails_says_so_and_keeps_roseinfers_figures(fake_vllm, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    path = tmp_path / "serve.json"
    assert main(serve_argv(path)) == 1
    out = capsys.readouterr().out
    assert "the vLLM peer exited with 1" in out
    report = json.loads(path.read_text())
    assert report["rows"][0]["requests"] == 4 and "error" in report["peer"]


def test_side_by_side_divides_each_rate_by_its_own_peer_row():
    ours = [{"rate": 1.0, "output_tok_s": 30.0}, {"rate": 2.0, "output_tok_s": 50.0}]
    theirs = [{"rate": 1.0, "output_tok_s": 10.0}, {"rate": 2.0, "output_tok_s": 100.0}]
    rows = serve_vllm.side_by_side(ours, theirs)
    assert [(r["engine"], r["x_peer"]) for r in rows] == [
        ("roseinfer", 3.0),
        ("vLLM", None),
        ("roseinfer", 0.5),
        ("vLLM", None),
    ]
    with pytest.raises(ValueError):  # a peer that ran other rates is not set beside these
        serve_vllm.side_by_side(ours, theirs[:1])
