"""`roseinfer bench offload --peer vllm` on the CPU, against a stand-in vLLM that keeps a GPU prefix cache and a CPU
tier of whole blocks: each configuration runs in a process of its own with vLLM's options for it, on the prompts
roseinfer ran, `cpu` with the GPU cache reset before every run, and the side-by-side table divides each point by
its own peer point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roseinfer.bench import offload, offload_vllm
from roseinfer.bench.plots import plot_report, pyplot
from roseinfer.entrypoints.cli import main
from roseinfer.models.loader import resolve_model_path
from tests.fake_vllm import GENERATE_PRELUDE, entries, install_fake_vllm

FAKE = {
    "vllm/__init__.py": GENERATE_PRELUDE
    + """
class _Out:
    def __init__(self, n, cached):
        self.outputs = [type("C", (), {"token_ids": [7] * n})()]
        self.num_cached_tokens = cached

class LLM:
    def __init__(self, **kw):
        if os.environ.get("FAKE_VLLM_FAIL"):
            raise RuntimeError("stand-in engine refuses to start")
        log(kind="engine", args={k: v for k, v in kw.items() if k != "model"})
        self.block = kw.get("block_size") or 16
        self.prefix = kw["enable_prefix_caching"]
        self.tier = kw.get("kv_offloading_size") is not None
        self.gpu, self.cpu = set(), set()

    def _blocks(self, p):
        return [tuple(p[: (i + 1) * self.block]) for i in range(len(p) // self.block)]

    def generate(self, prompts, params, use_tqdm=True):
        cached = []
        for item in prompts:
            p = item["prompt_token_ids"]
            blocks = self._blocks(p[:-1])  # the last token is always computed
            n = 0
            while self.prefix and n < len(blocks) and blocks[n] in self.gpu:
                n += 1
            m = n
            while self.tier and m < len(blocks) and blocks[m] in self.cpu:
                m += 1
            cached.append(m * self.block)
            if self.prefix:
                self.gpu.update(self._blocks(p))
            if self.tier:
                self.cpu.update(self._blocks(p))
        log(kind="generate", prompts=[p["prompt_token_ids"] for p in prompts], params=params.kw)
        return [_Out(params.kw["max_tokens"], c) for c in cached]

    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        log(kind="reset", connector=reset_connector)
        self.gpu.clear()
        if reset_connector:
            self.cpu.clear()
        return True
""",
}

PROMPT_LEN = 40  # two whole blocks of 16 before the last token


def vocab_size(shape: str) -> int:
    return json.loads(Path(resolve_model_path(shape, need_weights=False)).read_text())["vocab_size"]


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return install_fake_vllm(tmp_path, monkeypatch, FAKE)


def argv(path: Path, *extra: str) -> list[str]:
    return [
        "bench",
        "offload",
        "--model-shape",
        "tiny-llama",
        "--workload",
        "W7",
        "--num-requests",
        "3",
        "--prompt-len",
        str(PROMPT_LEN),
        "--outputs",
        "2",
        "--kv-offloading-size",
        "0.01",
        "--no-progress",
        "--peer",
        "vllm",
        "--json",
        str(path),
        *extra,
    ]


def test_each_configuration_runs_through_vllm_with_its_options_on_roseinfers_prompts(
    fake_vllm, tmp_path, capsys
):
    path = tmp_path / "offload.json"
    assert main(argv(path)) == 0
    engines = [e["args"] for e in entries(fake_vllm, "engine")]
    # none, gpu, gpu+cpu, cpu
    assert [e["enable_prefix_caching"] for e in engines] == [False, True, True, True]
    assert [e.get("kv_offloading_size") for e in engines] == [None, None, 0.01, 0.01]
    assert all(e.get("kv_offloading_backend") == "native" for e in engines[2:])
    assert all(
        e["max_num_batched_tokens"] == offload.STEP_BUDGET and "disable_log_stats" not in e for e in engines
    )
    timed = [
        g for g in entries(fake_vllm, "generate") if g["params"]["max_tokens"] == 2 and len(g["prompts"]) == 3
    ]
    want = offload.random_prompts(3, PROMPT_LEN, vocab_size("tiny-llama"), seed=7)  # W7's seed
    assert want in [g["prompts"] for g in timed] and all(g["params"]["temperature"] == 0.0 for g in timed)

    report = json.loads(path.read_text())
    peer = report["peer"]
    assert peer["version"] == "0.0-stand-in" and "error" not in peer
    rows = peer["results"]["W7"]
    assert list(rows) == list(offload.CONFIGS) and all(len(r) == 3 for r in rows.values())
    whole = 3 * 32  # the three prompts' two whole blocks
    # a cold start at round 1, then every whole block found: in the GPU cache, or (`cpu`) in the tier alone
    for name in ("gpu", "gpu+cpu", "cpu"):
        assert [r["hit_tokens"] for r in rows[name]] == [0, whole, whole]
    assert [r["hit_tokens"] for r in rows["none"]] == [0, 0, 0]

    if pyplot() is not None:  # the side-by-side plot, drawn with the report and again by `bench plot`
        assert set(report["plots"]) == {"W7", "W7_vllm"}
        again = plot_report(report, str(tmp_path / "again"))
        assert again == {w: str(tmp_path / f"again.{w}.png") for w in ("W7", "W7_vllm")}
        assert (tmp_path / "again.W7_vllm.png").stat().st_size > 0

    out = capsys.readouterr().out
    table = out[out.index("== W7 beside vLLM 0.0-stand-in") :].splitlines()
    assert table[1].split() == ["N", "round", *offload.CONFIGS]
    ours = report["results"]["W7"]
    first = table[2].split()  # N=2, round 1: "ours / vLLM (ratio)" per configuration
    for i, name in enumerate(offload.CONFIGS):
        a, b = ours[name][0]["req_per_s"], rows[name][0]["req_per_s"]
        assert first[2 + 4 * i : 6 + 4 * i] == [f"{a:.2f}", "/", f"{b:.2f}", f"({a / b:.2f}x)"]


def test_the_cpu_configuration_resets_the_gpu_cache_before_every_run_and_both_tiers_each_round_one(
    fake_vllm, tmp_path
):
    assert main(argv(tmp_path / "o.json", "--configs", "cpu,gpu+cpu")) == 0
    log = [json.loads(line) for line in fake_vllm.read_text().splitlines()]
    per_engine: list[list[str]] = []
    for e in log:
        if e["kind"] == "engine":
            per_engine.append([])
        elif e["kind"] == "reset":
            per_engine[-1].append("both" if e["connector"] else "gpu")
        else:
            per_engine[-1].append("run")
    # the warm-up's rounds then the timed ones: a cold start (both tiers) at each round 1
    cpu, gpu_cpu = per_engine
    assert cpu == ["both", "gpu", "run", "gpu", "run", "gpu", "run"] * 2
    assert gpu_cpu == ["both", "run", "run", "run"] * 2


def test_a_peer_that_fails_says_so_and_keeps_roseinfers_figures(fake_vllm, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    path = tmp_path / "offload.json"
    assert main(argv(path, "--configs", "gpu")) == 1
    assert "the vLLM peer exited with 1" in capsys.readouterr().out
    report = json.loads(path.read_text())
    assert len(report["results"]["W7"]["gpu"]) == 3 and "error" in report["peer"]


def test_a_run_cut_short_in_the_peer_leaves_its_finished_configurations_in_the_json(
    fake_vllm, tmp_path, monkeypatch
):
    real, calls = offload_vllm.run_peer, []

    def cut_on_the_second(command):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what a time limit does to a run in the middle
        return real(command)

    monkeypatch.setattr(offload_vllm, "run_peer", cut_on_the_second)
    path = tmp_path / "offload.json"
    with pytest.raises(KeyboardInterrupt):
        main(argv(path, "--configs", "gpu,cpu"))
    saved = json.loads(path.read_text())
    assert list(saved["results"]["W7"]) == ["gpu", "cpu"]  # roseinfer's, all done before the peer
    assert list(saved["peer"]["results"]["W7"]) == ["gpu"] and len(saved["peer"]["results"]["W7"]["gpu"]) == 3
