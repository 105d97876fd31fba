"""`scripts/gpu_check.sh peers` with stand-ins for vLLM's bench and roseinfer's CLI: it runs every step, keeps the
logs outside `$OUT`, returns them as one archive, and its closing table divides the right numbers."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from tests.gpu_check_run import run_gpu_check

FAKE_VLLM = """
import json, os, sys
shape = "llama" if "--config" in sys.argv else "qwen"
print(f"W1: 1.0s, 8192 out tokens, {shape} out tok/s")
rates = {"qwen": (10000.0, 20000.0), "llama": (4000.0, 8000.0)}[shape]
with open(os.path.join(os.environ["OUT"], "vllm_w1.json"), "w") as f:
    json.dump({"W1": {"out_tok_s": rates[0]}, "W2": {"out_tok_s": rates[1]}}, f)
"""

# Writes completion throughput = 3 x vLLM's qwen W1, 4 x its qwen W2, 1 x llama's: the table must divide them.
FAKE_RI = """
rate() { case "$1 $2" in "qwen2.5-0.5b W1") echo 30000;; "qwen2.5-0.5b W2") echo 80000;;
         "llama-3.1-8b W1") echo 4000;; *) echo 8800;; esac; }
shape=""; w=""; j=""; prev=""
for a in "$@"; do
  [ "$prev" = --model-shape ] && shape=$a; [ "$prev" = --workload ] && w=$a; [ "$prev" = --json ] && j=$a; prev=$a
done
echo "Throughput (completion): $(rate $shape $w) tokens/s"
echo "{\\"results\\": {\\"continuous\\": {\\"completion_throughput\\": $(rate $shape $w)}}}" > "$j"
"""


@pytest.mark.skipif(os.name != "posix", reason="bash script")
def test_peers_section_runs_every_step_and_divides_the_right_numbers(tmp_path: Path) -> None:
    peers = tmp_path / "peers"
    peers.mkdir()
    (peers / "install.sh").write_text('echo "offline-path imports checked in 1.0s"\n')
    (peers / "bench_w1_w2.py").write_text(FAKE_VLLM)
    (tmp_path / "ri.sh").write_text(FAKE_RI)
    out, logs = tmp_path / "out", tmp_path / "logs"
    run = run_gpu_check(
        "peers",
        120,
        OUT=str(out),
        GPU_CHECK_LOGS=str(logs),
        PEERS_DIR=str(peers),
        RI=f"bash {tmp_path}/ri.sh",
    )
    assert run.returncode == 0, run.stderr
    table = run.stdout[run.stdout.index("vLLM out tok/s") :].splitlines()
    rows = {tuple(line.split()[:2]): line.split()[-1] for line in table[1:6]}
    assert rows == {
        ("qwen2.5-0.5b", "W1"): "3.00x",
        ("qwen2.5-0.5b", "W2"): "4.00x",
        ("llama-3.1-8b", "W1"): "1.00x",
        ("llama-3.1-8b", "W2"): "1.10x",
        ("llama-3.1-8b", "W2-lof-512"): "1.10x",
    }
    assert "FAILED" not in run.stdout
    assert json.loads((logs / "vllm_llama-3.1-8b.json").read_text())["W1"]["out_tok_s"] == 4000.0
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check_logs.tgz"]  # one file comes back
    with tarfile.open(out / "gpu_check_logs.tgz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"vllm-qwen2.5-0.5b.log", "W2-lof-512_llama-3.1-8b.json"} <= names


# Logs each call's shape, its arguments after the shape and the PYTHONPATH it ran with; prints a table row.
FAKE_DECODE_RI = """
echo "$PYTHONPATH | $*" >> "$DECODE_CALLS"
echo "   64  1024     0.428         1.035     2.42    4.058     9.48              3.92"
"""


@pytest.mark.skipif(os.name != "posix", reason="bash script")
def test_decode_peers_section_times_both_shapes_beside_vllm(tmp_path: Path) -> None:
    peers = tmp_path / "peers"
    peers.mkdir()
    (peers / "install.sh").write_text('echo "offline-path imports checked in 1.0s"\n')
    (tmp_path / "ri.sh").write_text(FAKE_DECODE_RI)
    calls, logs = tmp_path / "calls.txt", tmp_path / "logs"
    run = run_gpu_check(
        "decode-peers",
        60,
        GPU_CHECK_LOGS=str(logs),
        PEERS_DIR=str(peers),
        RI=f"bash {tmp_path}/ri.sh",
        DECODE_CALLS=str(calls),
        DECODE_ARGS="--contexts 1024,4096",
    )
    assert run.returncode == 0, run.stderr
    lines = calls.read_text().splitlines()
    assert len(lines) == 2 and all(line.startswith("/tmp/vsite:") for line in lines)
    expected = {
        "qwen2.5-0.5b": "--batches 1,16,64",
        "llama-3.1-8b": "--batches 1,64",
    }
    for line, (shape, batches) in zip(lines, expected.items(), strict=True):
        args = line.split(" | ", 1)[1]
        assert args == (
            f"bench decode --model-shape {shape} {batches} --contexts 1024,4096 --peer vllm --no-progress "
            f"--json {logs}/decode_vllm_{shape}.json"
        )
    assert "decode-vllm-qwen2.5-0.5b ok" in run.stdout and "decode-vllm-llama-3.1-8b ok" in run.stdout
    assert "4.058" in run.stdout  # each section's table rows reach the summary
