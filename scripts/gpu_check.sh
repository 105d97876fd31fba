#!/usr/bin/env bash
# One GPU pass: gpu-marked tests, kernel benchmarks, roofline, throughput vs HF, prefix-cache benchmarks.
# Usage (on a CUDA machine, repository root): bash scripts/gpu_check.sh [quick]
# Writes logs and JSON under ${OUT:-/tmp/roseinfer-gpu}; prints a short table last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/roseinfer-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
RI="python3 -m roseinfer.entrypoints.cli"
status=()
step() {  # step NAME COMMAND...: run, log, remember pass/fail
    local name=$1; shift
    local t0=$SECONDS
    echo "=== $name: $*"
    if "$@" > "$OUT/$name.log" 2>&1; then status+=("$name ok $((SECONDS - t0))s"); else status+=("$name FAILED $((SECONDS - t0))s"); fi
    tail -n 25 "$OUT/$name.log"
}
step gpu-tests python3 -m pytest -q -m gpu tests -x -p no:cacheprovider
step kernels $RI bench kernels
step roofline-qwen $RI bench roofline --model-shape qwen2.5-0.5b --json "$OUT/roofline_qwen.json"
if [ "${1:-}" != quick ]; then
  step roofline-llama $RI bench roofline --model-shape llama-3.1-8b --batches 1,16,64 --prefill-tokens 512,2048,4096,8192 --json "$OUT/roofline_llama.json"
fi
step w1-qwen-hf $RI bench throughput --model-shape qwen2.5-0.5b --workload W1 --mode all --peer hf --json "$OUT/w1_qwen.json"
step w2-qwen $RI bench throughput --model-shape qwen2.5-0.5b --workload W2 --mode continuous --json "$OUT/w2_qwen.json"
step prefix $RI bench prefix --model-shape qwen2.5-0.5b --workload all --num-requests 64 --json "$OUT/prefix.json"
echo
echo "=== summary"
for s in "${status[@]}"; do echo "  $s"; done
grep -h -E "^(roofline|step|decode|prefill)" "$OUT"/roofline-*.log 2>/dev/null | tail -n 30
grep -h -E "Throughput \(completion\)|^=== |ratio" "$OUT"/w1-qwen-hf.log "$OUT"/w2-qwen.log 2>/dev/null | tail -n 20
