"""`roseinfer generate`, `roseinfer bench throughput` (every mode, HF peer), workloads, the bench header and
the roseinfer -> HF weight exporter, all on the CPU with tiny shapes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from roseinfer import LLM, SamplingParams
from roseinfer.bench.env import bench_header, device_name, format_header, git_commit, measure_copy_bandwidth
from roseinfer.bench.throughput import build_hf_model, export_to_hf, roofline_floor
from roseinfer.bench.workloads import build_workload, token_id_range
from roseinfer.entrypoints.cli import BENCH_COMMANDS, main
from roseinfer.models.layers import ForwardContext
from roseinfer.request import Request
from roseinfer.scheduler.scheduler import ScheduledRequest, SchedulerOutput
from tests.models.tiny_models import TINY_CONFIGS

REPORT_FIELDS = {
    "Requests": r"(\d+)",
    "Elapsed (prefill/add)": r"([\d.]+) seconds",
    "Elapsed (decode/run)": r"([\d.]+) seconds",
    "Elapsed (total)": r"([\d.]+) seconds",
    "Prompt tokens": r"(\d+)",
    "Completion tokens": r"(\d+)",
    "Total tokens": r"(\d+)",
    "Throughput (completion)": r"([\d.]+) tokens/s",
    "Throughput (total)": r"([\d.]+) tokens/s",
}


def parse_block(text: str, name: str) -> dict[str, float]:
    """The numbers of one `=== name ===` report block."""
    block = text.split(f"=== {name} ===\n", 1)[1].split("===", 1)[0]
    values = {}
    for key, pattern in REPORT_FIELDS.items():
        m = re.search(rf"^{re.escape(key)}: {pattern}$", block, re.M)
        assert m, f"{name}: no {key!r} line in\n{block}"
        values[key] = float(m.group(1))
    return values


# -- generate --------------------------------------------------------------------------------------


def test_generate_default_model_prints_token_ids(capsys):
    assert main(["generate", "--max-tokens", "5", "--temperature", "0", "--ignore-eos"]) == 0
    out = capsys.readouterr()
    ids = out.out.strip().split(",")
    assert len(ids) == 5 and all(0 <= int(t) < 32000 for t in ids)
    assert re.search(r"^# Start-up: [0-9.]+ s \(load model ", out.err, re.M)  # beside the output, not in it


def test_generate_prompt_ids_greedy_is_deterministic(capsys):
    argv = ["generate", "--prompt-ids", "5,6,7,8", "--max-tokens", "4", "--temperature", "0", "--ignore-eos"]
    main(argv)
    first = capsys.readouterr().out
    main(argv)
    assert capsys.readouterr().out == first


def test_generate_text_prompt_without_tokenizer_is_a_clear_error(capsys):
    assert main(["generate", "--prompt", "hello"]) == 2
    assert "no tokenizer" in capsys.readouterr().err


# -- bench throughput ------------------------------------------------------------------------------


@pytest.mark.parametrize("workload", ["W1", "W2"])
def test_bench_throughput_all_modes_with_hf_peer(workload, capsys, tmp_path):
    out_json = tmp_path / "report.json"
    argv = [
        "bench", "throughput", "--model-shape", "tiny-llama", "--workload", workload, "--mode", "all",
        "--peer", "hf", "--num-requests", "3", "--max-prompt-len", "24", "--max-output-len", "6",
        "--warmup-requests", "1", "--hf-batch-size", "2", "--json", str(out_json),
    ]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out

    for key, value in {
        "workload": workload,
        "model_shape": "tiny-llama",
        "device": device_name(),
        "command": "roseinfer bench throughput --model-shape tiny-llama",
    }.items():
        assert re.search(rf"^# {key}\s*: {re.escape(value)}", text, re.M), f"header lacks {key}"
    assert re.search(r"^# commit\s*: (unknown|[0-9a-f]{4,}(-dirty)?)$", text, re.M)

    report = json.loads(out_json.read_text())
    wl = build_workload(workload, 32000, num_requests=3, max_prompt_len=24, max_output_len=6)
    for name in ("naive", "static", "continuous", "hf"):
        v = parse_block(text, name)
        assert v["Requests"] == 3
        assert v["Prompt tokens"] == wl.num_prompt_tokens
        assert v["Completion tokens"] == wl.num_output_tokens
        assert v["Total tokens"] == v["Prompt tokens"] + v["Completion tokens"]
        assert all(x > 0 for x in v.values()), f"{name}: {v}"
        assert v["Elapsed (total)"] == pytest.approx(
            v["Elapsed (prefill/add)"] + v["Elapsed (decode/run)"], abs=2e-6
        )
        saved = report["peer"] if name == "hf" else report["results"][name]
        assert saved["completion_tokens"] == wl.num_output_tokens
        assert saved["total_time"] > 0
        if name != "hf":  # outputs of several tokens: some steps decode only
            assert saved["extra"]["num_decode_steps"] >= 1 and saved["extra"]["decode_step_median_s"] > 0
            assert re.search(
                rf"^Decode-only steps: {saved['extra']['num_decode_steps']}, median ", text, re.M
            )
            assert saved["extra"]["scheduler"]["policy"] == "fcfs"
    for mode in ("naive", "static", "continuous"):
        assert f"Ratio roseinfer/HF (completion tok/s), {mode}:" in text
        assert report["ratio_to_hf"][mode] > 0
        startup = report["startup"][mode]  # each mode's engine, its start-up
        assert [s["name"] for s in startup["stages"]][0] == "load model" and startup["seconds"] > 0
        assert startup["num_blocks"] == report["results"][mode]["extra"]["num_kv_blocks"]
        assert re.search(rf"^{mode}: Start-up: [0-9.]+ s \(", text, re.M)
    assert report["header"]["workload"] == workload
    if torch.cuda.is_available():  # the floor comes from this device's measured limits
        roof = report["roofline"]
        assert roof["bandwidth_bytes_per_s"] > 0 and roof["matmul_tflops"] > 0 and roof["prefill_flops"] > 0
    else:
        assert report["roofline"] is None  # CPU: no device limits


def test_bench_throughput_takes_the_admission_policy_and_budget(capsys, tmp_path):
    out_json = tmp_path / "report.json"
    argv = [
        "bench", "throughput", "--model-shape", "tiny-llama", "--workload", "W2", "--num-requests", "5",
        "--max-prompt-len", "20", "--max-output-len", "7", "--warmup-requests", "1",
        "--admission-policy", "lof", "--max-num-batched-tokens", "24", "--json", str(out_json),
    ]  # fmt: skip
    assert main(argv) == 0
    line = r"^Scheduler: lof, 24 tokens a step, \d+ sequences; KV cache auto, \d+ blocks$"
    printed = capsys.readouterr().out
    assert re.search(line, printed, re.M)
    # the CPU's steps: no key splits or long-chunk tile (the interpreter's tile only)
    assert re.search(r"; 0 with prefill keys split, 0 in the long chunks' prefill tile$", printed, re.M)
    saved = json.loads(out_json.read_text())["results"]["continuous"]
    assert saved["extra"]["step_paths"]["long_tile"] == 0
    assert saved["extra"]["scheduler"]["policy"] == "lof"
    assert saved["extra"]["scheduler"]["max_num_batched_tokens"] == 24
    wl = build_workload("W2", 32000, num_requests=5, max_prompt_len=20, max_output_len=7)
    assert saved["completion_tokens"] == wl.num_output_tokens


def test_bench_subcommands_are_registered():
    assert "throughput" in BENCH_COMMANDS
    with pytest.raises(SystemExit):
        main(["bench", "no-such-bench"])


# -- the exporter ----------------------------------------------------------------------------------


def engine_prefill_logits(llm: LLM, prompt: list[int]) -> torch.Tensor:
    core = llm.engine.core
    req = Request("logits-probe", prompt, SamplingParams(max_tokens=1))
    assert core.kv.allocate_slots(req, len(prompt))
    try:
        out = SchedulerOutput([ScheduledRequest(req, len(prompt), 0)])
        ids, pos, meta = core.runner.prepare_inputs(out)
        with torch.inference_mode():
            hidden = core.runner.model(
                ids, pos, ForwardContext(core.runner.kv_cache, meta, core.runner.backend)
            )
            return core.runner.model.compute_logits(hidden)
    finally:
        core.kv.free(req)


@pytest.mark.parametrize("arch", sorted(TINY_CONFIGS))
def test_hf_export_round_trips_logits(arch, tmp_path: Path):
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(TINY_CONFIGS[arch]))
    llm = LLM(str(config_file), load_format="dummy", device="cpu", dtype="float32", cpu_kv_tokens=512)
    model = llm.engine.core.runner.model
    hf = build_hf_model(llm.engine.model_config, torch.float32, torch.device("cpu"))
    export_to_hf(model, hf)
    prompt = np.random.default_rng(1).integers(3, 384, size=37).tolist()
    ours = engine_prefill_logits(llm, prompt)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    rel = ((ours - ref).norm() / ref.norm()).item()
    assert rel < 1e-4, f"{arch}: relative logits error {rel:.2e}"


def test_hf_export_fails_loudly_when_a_parameter_has_no_source(tmp_path: Path):
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(TINY_CONFIGS["llama"]))
    llm = LLM(str(config_file), load_format="dummy", device="cpu", dtype="float32", cpu_kv_tokens=512)
    hf = build_hf_model(llm.engine.model_config, torch.float32, torch.device("cpu"))
    hf.register_parameter("extra_weight", torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(ValueError, match="extra_weight"):
        export_to_hf(llm.engine.core.runner.model, hf)


# -- workloads -------------------------------------------------------------------------------------


def test_standard_workload_shapes():
    w1 = build_workload("W1", 151936)
    assert w1.num_requests == 64 and set(w1.prompt_lens) == {512} and set(w1.output_lens) == {128}
    assert all(p.temperature == 0.0 and p.ignore_eos for p in w1.params) and not w1.scaled
    w2 = build_workload("w2", 151936)
    assert w2.num_requests == 256
    assert 100 <= min(w2.prompt_lens) and max(w2.prompt_lens) <= 1024 and len(set(w2.prompt_lens)) > 100
    assert 100 <= min(w2.output_lens) and max(w2.output_lens) <= 1024
    assert all(p.temperature == 0.6 and p.ignore_eos for p in w2.params)
    w4 = build_workload("W4", 151936)
    assert w4.num_requests == 64 and w4.prompt_lens[0] == 856 and set(w4.output_lens) == {16}
    assert all(p == w4.prompts[0] for p in w4.prompts)
    w5 = build_workload("W5", 151936)
    assert w5.num_requests == 512 and w5.prompt_lens[0] == 65 and set(w5.output_lens) == {2}
    assert w5.engine_overrides == {"block_size": 64, "max_num_seqs": 16}
    low, high = token_id_range(151936)
    assert (low, high) == (1000, 32000)
    ids = np.array([t for p in w2.prompts for t in p])
    assert ids.min() >= 1000 and ids.max() < 32000
    with pytest.raises(ValueError, match="unknown workload"):
        build_workload("W9", 1000)


def test_workloads_are_deterministic_and_scalable():
    a = build_workload("W2", 32000)
    b = build_workload("W2", 32000)
    assert a.prompts == b.prompts and a.output_lens == b.output_lens
    assert build_workload("W2", 32000, seed=1).prompts != a.prompts
    small = build_workload("W2", 32000, num_requests=5, max_prompt_len=50, max_output_len=20)
    assert small.scaled and small.num_requests == 5
    assert max(small.prompt_lens) <= 50 and max(small.output_lens) <= 20
    assert build_workload("W1", 32000, max_output_len=1000).output_lens[0] == 128


# -- header and floor ------------------------------------------------------------------------------


def test_bench_header_fields(monkeypatch):
    h = bench_header("W1", "qwen2.5-0.5b", command=["roseinfer", "bench", "throughput"], device="cpu")
    assert h["workload"] == "W1" and h["model_shape"] == "qwen2.5-0.5b" and h["device"] == "cpu"
    assert h["command"] == "roseinfer bench throughput"
    assert re.fullmatch(r"unknown|[0-9a-f]{4,}(-dirty)?", h["commit"])
    assert h["commit"] == git_commit()
    for key in ("torch", "triton", "date"):
        assert h[key]
    text = format_header(h)
    assert "W1" in text and "qwen2.5-0.5b" in text
    monkeypatch.delenv("ROSEINFER_COMMIT", raising=False)
    assert git_commit("/") == "unknown"
    monkeypatch.setenv("ROSEINFER_COMMIT", "abc1234-dirty")
    assert git_commit("/") == "abc1234-dirty"
    assert git_commit() == "abc1234-dirty"  # the variable wins over a (possibly stale) .git
    with pytest.raises(ValueError, match="CUDA"):
        measure_copy_bandwidth("cpu")


def test_roofline_floor_grows_with_the_work():
    from roseinfer.config import ModelConfig
    from roseinfer.models.loader import BUILTIN_CONFIG_DIR

    cfg = ModelConfig.from_path(f"{BUILTIN_CONFIG_DIR}/qwen2.5-0.5b.json")
    small = roofline_floor(cfg, torch.bfloat16, build_workload("W1", 151936, num_requests=8), 256, 3e12, 790)
    full = roofline_floor(cfg, torch.bfloat16, build_workload("W1", 151936), 256, 3e12, 790)
    assert 0 < small["floor_s"] < full["floor_s"]
    assert full["decode_steps"] == 127
    # 127 steps each read ~0.99 GB of bf16 weights: about 0.04 s at 3 TB/s
    assert 0.03 < full["decode_weight_bytes"] / 3e12 < 0.05


def test_roofline_table_prints_both_decode_timings():
    from roseinfer.bench.roofline import format_table

    header = {"model_shape": "qwen2.5-0.5b", "device": "test GPU"}
    decode = {"kind": "decode", "batch": 64, "context": 1024, "graph": True, "ms": 1.4, "floor_ms": 0.6,
              "x_floor": 1.4 / 0.6, "achieved_TBps": 1.3, "steady_ms": 1.2, "steady_x_floor": 2.0}  # fmt: skip
    old = {k: v for k, v in decode.items() if not k.startswith("steady")}  # a report from before `steady`
    prefill = {"kind": "prefill", "tokens": 512, "graph": True, "ms": 2.0, "floor_ms": 1.0, "x_floor": 2.0,
               "achieved_TFLOPs": 400.0, "pct_matmul_rate": 50.0}  # fmt: skip
    skipped = {"kind": "decode", "batch": 256, "context": 4096, "skipped": "KV does not fit"}
    old_prefill = {k: v for k, v in prefill.items() if k != "graph"}
    result = {"header": header, "bandwidth_TBps": 3.0, "matmul_TFLOPs": 790.0,
              "rows": [decode, old, prefill, skipped, old_prefill]}  # fmt: skip
    lines = format_table(result).splitlines()
    assert lines[2].split() == "step ms floor ms x floor steady ms x floor note".split()
    assert lines[3].split()[:8] == ["decode", "b=64", "ctx=1024", "1.400", "0.600", "2.33", "1.200", "2.00"]
    assert lines[4].split()[5:8] == ["2.33", "-", "-"]
    assert lines[5].split()[:7] == ["prefill", "512", "2.000", "1.000", "2.00", "-", "-"]
    assert lines[6].split()[3:8] == ["-"] * 5
    assert lines[5].endswith("50% of matmul rate graph") and lines[7].endswith("50% of matmul rate")


def test_kernel_bench_says_which_targets_are_met():
    from roseinfer.bench.kernels import target_lines

    rows = [
        {"kernel": "d2d_copy", "model": "-", "ms": 0.7},
        {"kernel": "paged_decode", "model": "qwen2.5-0.5b", "pct_of_copy": 83.4},
        {"kernel": "paged_decode", "model": "llama-3.1-8b", "pct_of_copy": 79.9},
        {"kernel": "paged_prefill", "model": "llama-3.1-8b", "vs_sdpa": 0.722},  # 1.385x SDPA's time
        {"kernel": "sdpa_flash", "model": "llama-3.1-8b", "vs_sdpa": 1.0},
    ]
    lines = target_lines(rows)
    assert len(lines) == 3
    assert "qwen2.5-0.5b reads KV at 83.4%" in lines[0] and lines[0].endswith(": met")
    assert "llama-3.1-8b reads KV at 79.9%" in lines[1] and lines[1].endswith(": MISSED")
    assert "1.39x SDPA flash's time" in lines[2] and lines[2].endswith(": MISSED")
    rows[3]["vs_sdpa"] = 1.023
    assert target_lines(rows)[2].endswith("0.98x SDPA flash's time (<= 1.25x): met")
    # `--long-prefix` rows (a chunk over a cached prefix, timed against FA3) carry no fresh-prompt target
    long_prefix = {"kernel": "paged_prefill", "model": "llama-3.1-8b", "x_ours": 1.0, "tflops": 306.4}
    assert target_lines([*rows, long_prefix]) == target_lines(rows)


@pytest.mark.parametrize("bench", ["throughput", "prefix"])
@pytest.mark.parametrize("flag", ["--warmup-requests", "--warmup-output-len"])
def test_a_warmup_of_zero_is_refused_not_raised_to_one(bench: str, flag: str, capsys):
    with pytest.raises(SystemExit):
        main(["bench", bench, "--model-shape", "tiny-llama", flag, "0"])
    assert f"argument {flag}: must be >= 1" in capsys.readouterr().err


def test_the_throughput_floor_counts_a_shared_prompt_once_with_the_prefix_cache(tmp_path: Path):
    """W4's prompts are one prompt 64 times: with the prefix cache on (the default), the run computes a
    fraction of their tokens, and the floor must stay under what it computed."""
    from roseinfer.bench.roofline_floor import distinct_prompt_tokens, roofline_floor
    from roseinfer.config import ModelConfig
    from roseinfer.models.loader import BUILTIN_CONFIG_DIR

    out = tmp_path / "w4.json"
    scale = ["--num-requests", "8", "--max-prompt-len", "128", "--max-output-len", "2"]
    main(["bench", "throughput", "--model-shape", "tiny-llama", "--device", "cpu", "--workload", "W4", *scale,
          "--warmup-requests", "1", "--json", str(out)])  # fmt: skip
    computed = json.loads(out.read_text())["results"]["continuous"]["extra"]["num_prompt_tokens_computed"]
    cfg = ModelConfig.from_path(f"{BUILTIN_CONFIG_DIR}/tiny-llama.json")
    workload = build_workload("W4", cfg.vocab_size, num_requests=8, max_prompt_len=128, max_output_len=2)
    assert distinct_prompt_tokens(workload.prompts) == 128
    floors = [roofline_floor(cfg, torch.bfloat16, workload, 256, 3e12, 790, prefix_caching=p) for p in (1, 0)]
    needed = 2 * cfg.num_layers * cfg.layer_params() * computed + 2 * cfg.vocab_size * cfg.hidden_size * 8
    assert floors[0]["prefill_flops"] <= needed < floors[1]["prefill_flops"]
