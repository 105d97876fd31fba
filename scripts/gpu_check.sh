#!/usr/bin/env bash
# One GPU pass: gpu-marked tests, kernel benchmarks, roofline, throughput vs HF, prefix-cache benchmarks.
# Usage (CUDA machine, repository root): bash scripts/gpu_check.sh [SECTION ...]
#   sections: tests (gpu-marked, dealt over the GPUs; tests-kernels and tests-e2e are its halves), kernels roofline
#             roofline-llama throughput throughput-llama prefix (default: all),
#             peers (vLLM beside roseinfer), kv-fp8, gemv, fold, profile, host, steps, l2, mlp, pdl, megakernel, pdl-decode,
#             layouts, policy, mixed, ttft, splits, tail, serve, serve-http, serve-peers, decode-peers, offload, offload-peers,
#             kernels-fa3, long-tile, decode-split, long-graphs, eager-long, direct-launch, ncu (on request)
# Full logs and JSON go to ${GPU_CHECK_LOGS:-/tmp/roseinfer-gpu}; stdout gets each section's short summary. Where
# $OUT is set (the device tool's return folder, which brings back only a few files), they come back as one
# archive, $OUT/gpu_check_logs.tgz, rewritten after each step and on SIGTERM: run it under `timeout` below the
# call's limit, and a call cut short still brings back every log so far.
# The device copy of the tree has no .git: pass the commit for the report headers, e.g.
#   ROSEINFER_COMMIT=$(git rev-parse --short HEAD) bash scripts/gpu_check.sh   (run from here, in the command)
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${GPU_CHECK_LOGS:-/tmp/roseinfer-gpu}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
RI=${RI:-python3 -m roseinfer.entrypoints.cli}
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(tests kernels roofline roofline-llama throughput throughput-llama prefix)
summary=()
archive() {  # the logs so far as $OUT's one archive (where $OUT is set): after each step, so a call cut short keeps them
    if [ -n "${OUT:-}" ] && [ "$OUT" != "$LOGS" ]; then
        mkdir -p "$OUT" && tar -czf "$OUT/.gpu_check_logs.tgz" --exclude='*.ncu-rep' -C "$LOGS" . \
            && mv "$OUT/.gpu_check_logs.tgz" "$OUT/gpu_check_logs.tgz"
    fi
}
# A time limit's SIGTERM (timeout(1) signals the whole group): archive the step cut short with the rest.
trap 'archive; echo "=== stopped by a signal: logs so far in ${OUT:-$LOGS}"; exit 143' TERM INT
run() {  # run NAME FILTER COMMAND...: log everything, print the lines FILTER matches
    local name=$1 filter=$2; shift 2
    local t0=$SECONDS
    echo "=== $name"
    if "$@" > "$LOGS/$name.log" 2>&1; then summary+=("$name ok $((SECONDS - t0))s"); else summary+=("$name FAILED $((SECONDS - t0))s"); tail -n 30 "$LOGS/$name.log"; fi
    grep -E "$filter" "$LOGS/$name.log" | cut -c1-160 | tail -n 40
    archive
}
# sharded_pytest TAG K ARGS...: the tests ARGS select, dealt round-robin over K pytest processes a GPU on each of
# this machine's GPUs (CUDA_VISIBLE_DEVICES), so that Triton's compiles (CPU-bound) run side by side; one GPU, K=1: one
# process. K > 1 suits tests whose memory is small and fixed; a test whose engine sizes its KV cache by
# gpu_memory_utilization needs the GPU to itself, and says so with the `alone` marker. Logs: $LOGS/TAG.ids (every id), TAG.ids.I and TAG.shardI.log,
# TAG.alone.ids and TAG.alone.log.
sharded_pytest() {
    local tag=$1 k=$2 n m i rc=0 pids=(); shift 2
    rm -f "$LOGS/$tag".ids* "$LOGS/$tag".shard*.log "$LOGS/$tag".alone.*
    n=$(python3 -c "import torch; print(max(torch.cuda.device_count(), 1))")
    m=$((n * k))
    python3 -m pytest -q -p no:cacheprovider --collect-only "$@" | grep '::' > "$LOGS/$tag.ids" || return 1
    # Tests marked `timing` (they compare measured times) or `alone` (they size by the GPU's free memory) run
    # after the shards on GPU 0, one process each. The later -m wins over one in "$@"; the grep keeps only tests the
    # selection itself collected.
    { python3 -m pytest -q -p no:cacheprovider --collect-only "$@" -m "timing or alone" | grep '::' \
        | grep -Fxf "$LOGS/$tag.ids" || true; } > "$LOGS/$tag.alone.ids"
    echo "$(wc -l < "$LOGS/$tag.ids") tests over $n GPU(s), $k process(es) each; $(wc -l < "$LOGS/$tag.alone.ids") tests after, alone"
    for ((i = 0; i < m; i++)); do
        grep -vFxf "$LOGS/$tag.alone.ids" "$LOGS/$tag.ids" | awk -v m="$m" -v i="$i" 'NR % m == i' > "$LOGS/$tag.ids.$i"
        mapfile -t ids < "$LOGS/$tag.ids.$i"
        [ ${#ids[@]} -eq 0 ] && continue
        CUDA_VISIBLE_DEVICES=$((i % n)) python3 -m pytest -q -p no:cacheprovider "${ids[@]}" > "$LOGS/$tag.shard$i.log" 2>&1 &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=1; done
    # Each in its own process: what an earlier test left in a process moves its memory peak (a few hundred KB).
    while read -r id; do
        CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider "$id" < /dev/null >> "$LOGS/$tag.alone.log" 2>&1 || rc=1
    done < "$LOGS/$tag.alone.ids"
    for ((i = 0; i < m; i++)); do [ -f "$LOGS/$tag.shard$i.log" ] && { echo "shard $i:"; grep -E '^(FAILED|ERROR)|passed|failed' "$LOGS/$tag.shard$i.log" | tail -n 20; }; done
    [ -f "$LOGS/$tag.alone.log" ] && { echo "alone:"; grep -E '^(FAILED|ERROR)|passed|failed' "$LOGS/$tag.alone.log" | tail -n 20; }
    return $rc
}
REPORT='^=== |Elapsed \(total\)|Throughput \(completion\)|Ratio|x floor|floor|^Scheduler|^Steps|^Decode-only'
for s in "${sections[@]}"; do
  case $s in
    tests|tests-kernels|tests-e2e)
      # The kernel files (every test: unmarked ones run on the GPU here too) in KERNEL_PROCS (default 6) pytest
      # processes a GPU; KERNEL_TESTS picks files. The engine files in E2E_PROCS (default 3): their engines take
      # fixed KV pools, except two that size theirs at 0.3-0.5 of the GPU, which fits beside.
      # shellcheck disable=SC2086  # KERNEL_TESTS is a list of paths
      [ "$s" != tests-e2e ] && run tests-kernels 'passed|failed|error|tests over' sharded_pytest kernels "${KERNEL_PROCS:-6}" ${KERNEL_TESTS:-tests/kernels} ${KERNEL_K:+-k "$KERNEL_K"}
      [ "$s" != tests-kernels ] && run tests-e2e 'passed|failed|error|tests over' sharded_pytest e2e "${E2E_PROCS:-3}" -m gpu tests/gpu ${E2E_K:+-k "$E2E_K"} ;;
    kernels)
      run kernels 'decode|prefill|copy' $RI bench kernels
      run fused '^(model|qwen|llama)' $RI bench fused ;;
    roofline) run roofline-qwen '^(roofline|step|decode|prefill) ' $RI bench roofline --model-shape qwen2.5-0.5b --json "$LOGS/roofline_qwen.json" ;;
    roofline-llama) run roofline-llama '^(roofline|step|decode|prefill) ' $RI bench roofline --model-shape llama-3.1-8b --batches 1,16,64 --prefill-tokens 512,2048,4096,8192 --json "$LOGS/roofline_llama.json" ;;
    throughput)
      run w1-qwen "$REPORT" $RI bench throughput --model-shape qwen2.5-0.5b --workload W1 --mode continuous --peer hf --json "$LOGS/w1_qwen.json"
      run w1-qwen-static "$REPORT" $RI bench throughput --model-shape qwen2.5-0.5b --workload W1 --mode static --no-roofline --json "$LOGS/w1_qwen_static.json"
      run w2-qwen "$REPORT" $RI bench throughput --model-shape qwen2.5-0.5b --workload W2 --mode continuous --json "$LOGS/w2_qwen.json"
      run w2-qwen3 "$REPORT" $RI bench throughput --model-shape qwen3-0.6b --workload W2 --mode continuous --no-roofline --json "$LOGS/w2_qwen3.json" ;;
    throughput-llama)
      run w1-llama "$REPORT" $RI bench throughput --model-shape llama-3.1-8b --workload W1 --mode continuous --json "$LOGS/w1_llama.json"
      run w2-llama "$REPORT" $RI bench throughput --model-shape llama-3.1-8b --workload W2 --mode continuous --no-roofline --json "$LOGS/w2_llama.json" ;;
    policy)  # W2 llama: fcfs at the default budget, then longest-output-first at small budgets (POLICY_BUDGETS)
      run w2-llama-fcfs "$REPORT" $RI bench throughput --model-shape llama-3.1-8b --workload W2 --mode continuous --json "$LOGS/w2_llama_fcfs.json"
      for b in ${POLICY_BUDGETS:-320 384 512}; do
        run w2-llama-lof-$b "$REPORT" $RI bench throughput --model-shape llama-3.1-8b --workload W2 --mode continuous --no-roofline --admission-policy lof --max-num-batched-tokens $b --json "$LOGS/w2_llama_lof_$b.json"
      done ;;
    mixed)  # W2 llama under lof at small budgets (MIXED_BUDGETS), steps with prefill work eager (0) vs as graphs
      for b in ${MIXED_BUDGETS:-320 512}; do
        for m in 0 $b; do
          run w2-llama-lof-$b-graphs$m "$REPORT" $RI bench throughput --model-shape llama-3.1-8b --workload W2 --mode continuous --no-roofline --admission-policy lof --max-num-batched-tokens $b --mixed-graph-max-tokens $m --json "$LOGS/w2_llama_lof_${b}_graphs$m.json"
        done
      done ;;
    ttft)  # cache-miss TTFT by prompt length, steps with prefill work eager / graphed to 512 / to the automatic cap;
           # then W3 qwen online with graphs to 512 against the automatic cap (4096 for qwen2.5-0.5b)
      run ttft-qwen '^(\||cap|#)' python3 scripts/probe_prefill_latency.py --model-shape qwen2.5-0.5b
      run ttft-llama '^(\||cap|#)' python3 scripts/probe_prefill_latency.py --model-shape llama-3.1-8b --lengths 128,512,1000 --caps 0,auto --repeats 10
      for m in 512 auto; do
        flag=""; [ $m != auto ] && flag="--mixed-graph-max-tokens $m"
        run prefix-W3-graphs-$m '.' $RI bench prefix --model-shape qwen2.5-0.5b --workload W3 --num-requests ${W3_REQUESTS:-24} --no-progress $flag --json "$LOGS/prefix_W3_graphs_$m.json"
      done ;;
    long-tile)  # the long tile's kernels (Hopper's warp-specialised one, paged_prefill_ws.py): their tests, the engine
                # test, the tile sweep with and without it, then W7 llama (gpu)
      run tests-long-tile 'passed|failed|error' python3 -m pytest -q -p no:cacheprovider tests/kernels/test_paged_prefill_ws.py tests/kernels/test_direct_launch.py tests/kernels/test_paged_prefill_attention.py tests/gpu/test_gpu_long_tile_engine.py
      C="1 x 1024 over 9216,1 x 1024 over 4096,1 x 1024 over 1024,1 x 768 over 4096,4 x 2048 fresh,1 x 4096 fresh,16 x 512 fresh,1 x 512 over 512"
      run sweep-long-tile '^(shape|llama)' python3 scripts/sweep_prefill_tiles.py --shapes llama-3.1-8b --tiles 64x64,128x128 --cases "$C"
      run sweep-long-tile-no-ws '^(shape|llama)' python3 scripts/sweep_prefill_tiles.py --no-ws --shapes llama-3.1-8b --tiles 128x128 --cases "$C"
      run offload-W7-long-tile '^(N |[0-9])' $RI bench offload --model-shape llama-3.1-8b --workload W7 --configs gpu --no-progress --json "$LOGS/offload_W7_long_tile.json" ;;
    long-graphs)  # the mixed-step graphs' LONG_TILE twins (Hopper): their tests, both maps timed in graphs on llama-3.1-8b's and
                  # qwen3-0.6b's heads, follow-up turns over cached histories with the twins on and off, then W7 llama (gpu)
      run tests-long-graphs 'passed|failed|error' python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_long_tile_engine.py tests/runner/test_mixed_graph_bookkeeping.py tests/kernels/test_prefill_plan_host.py tests/gpu/test_gpu_startup.py
      C="1 x 1024 fresh,1 x 768 fresh,8 x 128 fresh,1 x 1024 over 1024,1 x 768 over 768,1 x 700 over 300,1 x 512 over 512,2 x 500 over 500,3 x 300 over 700,1 x 384 over 4096,1 x 512 over 4096,1 x 256 over 4096,4 x 256 over 1000,2 x 256 over 2048,1 x 100 over 900,1 x 1015 over 9216"
      run sweep-maps '^(shape|llama|qwen)' python3 scripts/sweep_prefill_tiles.py --maps --repeats 2 --shapes llama-3.1-8b,qwen3-0.6b --cases "$C"
      run ab-long-graphs-llama '^(llama|twins|off|on)' python3 scripts/ab_long_tile_graphs.py --model-shape llama-3.1-8b
      run ab-long-graphs-qwen3 '^(qwen|twins|off|on)' python3 scripts/ab_long_tile_graphs.py --model-shape qwen3-0.6b
      run offload-W7-long-graphs '^(N |[0-9])' $RI bench offload --model-shape llama-3.1-8b --workload W7 --configs gpu --no-progress --json "$LOGS/offload_W7_long_graphs.json" ;;
    eager-long)  # eager steps under the graphs' long-tile rule (TilePlanner.eager_map): the tests, eager follow-up turns
                 # with the rule on and off (llama in 1,024- and 4,096-token steps, qwen3-0.6b), then llama-3.1-8b's
                 # start-up with and without the warp-specialised kernel (so without the graphs' twins)
      run tests-eager-long 'passed|failed|error' python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_long_tile_engine.py tests/kernels/test_prefill_plan_host.py
      run ab-eager-llama-1k '^(llama|rule|off|on)' python3 scripts/ab_long_tile_graphs.py --model-shape llama-3.1-8b --eager --rounds 4
      run ab-eager-llama-4k '^(llama|rule|off|on)' python3 scripts/ab_long_tile_graphs.py --model-shape llama-3.1-8b --eager --rounds 4 --budget 4096
      run ab-eager-qwen3 '^(qwen|rule|off|on)' python3 scripts/ab_long_tile_graphs.py --model-shape qwen3-0.6b --eager --rounds 4
      for ws in True False; do
        run startup-llama-ws-$ws 'Start-up' python3 -c "import sys; from roseinfer.kernels import paged_prefill_ws as w; w.ENABLED = $ws
from roseinfer.entrypoints.cli import main; sys.exit(main(sys.argv[1:]))" generate --model llama-3.1-8b --load-format dummy --prompt-ids 1,2,3 --max-tokens 4
      done ;;
    direct-launch)  # the kernels launched from Python through DirectLaunch.run: the kernel and key tests, each launch's
                    # host time by each path, eager engines alternating DirectLaunch.run with Triton's binding step by step,
                    # then the host code's cdiv / next_power_of_2 with Triton's
      run tests-direct-launch 'passed|failed|error' python3 -m pytest -q -p no:cacheprovider tests/kernels/test_direct_launch_keys.py tests/kernels/test_fused_ops.py tests/kernels/test_qk_norm.py tests/kernels/test_triton_backend.py tests/kernels/test_pdl.py
      run launch-host 'host us|kernel|attention|rotary|rmsnorm|silu|norm|above|linear' python3 scripts/probe_triton_launch.py --calls 300
      for shape in qwen3-0.6b qwen2.5-0.5b llama-3.1-8b; do
        b=1024; [ "$shape" = llama-3.1-8b ] && b=512
        run ab-direct-$shape '(W2|host|wall|compiles)' python3 scripts/ab_direct_launch.py --model-shape "$shape" --max-num-batched-tokens $b --skip 40 --steps 100
      done
      run ab-host-math-qwen3 '(W2|host|wall|compiles)' python3 scripts/ab_direct_launch.py --model-shape qwen3-0.6b --skip 40 --steps 120 --against triton-math ;;
    decode-split)  # the mixed-step graphs' decodes split on the GPU (decode_split_merge.gpu_split): the GPU-split and
                   # backend tests, the mixed-graph e2e test (not the decode kernel's whole file: 204 tests outlast a
                   # call), W7 llama (gpu), W7's cold round traced (query it with trace-sql), the WS launch's host time, the prefill tile sweep timed in CUDA graphs (for the long-tile rule)
      run tests-decode-split 'passed|failed|error' python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu_split.py tests/kernels/test_triton_backend.py "tests/gpu/test_gpu_e2e.py::test_mixed_step_graphs_match_hf_on_gpu"
      run offload-W7-decode-split '^(N |[0-9])' $RI bench offload --model-shape llama-3.1-8b --workload W7 --configs gpu --no-progress --json "$LOGS/offload_W7_decode_split.json"
      run trace-W7-round1 'wrote' $RI bench offload --model-shape llama-3.1-8b --workload W7 --configs gpu --outputs 2 --no-progress --profile "$LOGS/w7.json.gz" --profile-gpu-only
      run launch-host '^(case|  )' python3 scripts/probe_prefill_launch_host.py
      run sweep-graph '^(shape|llama|qwen)' python3 scripts/sweep_prefill_tiles.py --graph --shapes llama-3.1-8b,qwen3-0.6b --tiles 64x64,128x128 ;;
    splits)  # prefill attention's key splits: the kernel on short chunks over long prefixes, then W3 qwen (prefix
             # hits) and W2 llama under lof (SPLIT_BUDGETS), each with and without the splits, alternating
      run sweep-prefill-splits '^(shape|llama|qwen|us|grid)' python3 scripts/sweep_prefill_splits.py
      for k in prefill-key-splits no-prefill-key-splits; do
        run prefix-W3-$k '.' $RI bench prefix --model-shape qwen2.5-0.5b --workload W3 --num-requests ${W3_REQUESTS:-24} --no-progress --$k --json "$LOGS/prefix_W3_$k.json"
      done
      for b in ${SPLIT_BUDGETS:-320 512}; do
        for k in prefill-key-splits no-prefill-key-splits; do
          run w2-llama-lof-$b-$k "$REPORT" $RI bench throughput --model-shape llama-3.1-8b --workload W2 --mode continuous --no-roofline --admission-policy lof --max-num-batched-tokens $b --$k --json "$LOGS/w2_llama_lof_${b}_$k.json"
        done
      done ;;
    serve)  # W8 online: rates double from 8 req/s until output tok/s stops growing, qwen2.5-0.5b then llama-3.1-8b
      run serve-qwen '^(=== |rate|-|[ 0-9]|W8|plot)' $RI bench serve --model-shape qwen2.5-0.5b --no-progress --json "$LOGS/serve_qwen.json"
      run serve-llama '^(=== |rate|-|[ 0-9]|W8|plot)' $RI bench serve --model-shape llama-3.1-8b --start-rate 4 --no-progress --json "$LOGS/serve_llama.json" ;;
    serve-http)  # W8 in-process, then the same rates through the OpenAI server from a client process (`bench serve
      # --http`), for SERVE_SHAPES (default qwen2.5-0.5b). fastapi, uvicorn and pydantic travel as wheels in .whl/ (README)
      if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"; fi
      for shape in ${SERVE_SHAPES:-qwen2.5-0.5b}; do
        start=(); [ "$shape" = llama-3.1-8b ] && start=(--start-rate 4)
        # shellcheck disable=SC2086  # SERVE_ARGS is a list of flags
        run serve-http-$shape '^(=== |rate|-|[ 0-9]|W8|plot|the HTTP)' \
          $RI bench serve --model-shape $shape "${start[@]}" ${SERVE_ARGS:-} --http --no-progress --json "$LOGS/serve_http_$shape.json"
      done ;;
    serve-peers)  # W8 beside vLLM 0.24's AsyncLLM (`bench serve --peer vllm`) for SERVE_SHAPES (default both), after the
                  # bundle's six chunks as for peers (installed here unless /tmp/vsite has it); SERVE_ARGS adds options
                  # (e.g. --rates 8,32,128,inf in place of the sweep).
      P=${PEERS_DIR:-.vb5}
      if [ ! -d /tmp/vsite/vllm ]; then run vllm-install 'checked|failed|mismatch|WARNING' bash "$P/install.sh"; fi
      for shape in ${SERVE_SHAPES:-qwen2.5-0.5b llama-3.1-8b}; do
        start=(); [ "$shape" = llama-3.1-8b ] && start=(--start-rate 4)
        # shellcheck disable=SC2086
        run serve-vllm-$shape '^(=== |rate|-|[ 0-9]|W8|plot|vLLM|the vLLM|roseinfer)' env PYTHONPATH="/tmp/vsite:$PYTHONPATH" \
          $RI bench serve --model-shape $shape "${start[@]}" ${SERVE_ARGS:-} --peer vllm --no-progress --json "$LOGS/serve_vllm_$shape.json"
      done ;;
    decode-peers)  # a full batch's decode step through each engine's generate (`bench decode --peer vllm`), against
                   # the floor, for DECODE_SHAPES (default both; qwen at b=1,16,64, llama at b=1,64), after the bundle's
                   # six chunks as for peers; DECODE_ARGS adds options (e.g. --contexts 1024,4096).
      P=${PEERS_DIR:-.vb5}
      if [ ! -d /tmp/vsite/vllm ]; then run vllm-install 'checked|failed|mismatch|WARNING' bash "$P/install.sh"; fi
      for shape in ${DECODE_SHAPES:-qwen2.5-0.5b llama-3.1-8b}; do
        batches=1,16,64; [ "$shape" = llama-3.1-8b ] && batches=1,64
        # shellcheck disable=SC2086
        run decode-vllm-$shape '^(=== |batch|-|[ 0-9]|vLLM|the vLLM|Start-up)' env PYTHONPATH="/tmp/vsite:$PYTHONPATH" \
          $RI bench decode --model-shape $shape --batches $batches ${DECODE_ARGS:-} --peer vllm --no-progress --json "$LOGS/decode_vllm_$shape.json"
      done ;;
    prefix)
      for w in W4 W5 cow-micro W2; do
        run prefix-$w '.' $RI bench prefix --model-shape qwen2.5-0.5b --workload $w --no-progress --json "$LOGS/prefix_$w.json"
      done
      # W3 is online: each rate takes (requests / rate) seconds, so it runs fewer requests per rate here.
      run prefix-W3 '.' $RI bench prefix --model-shape qwen2.5-0.5b --workload W3 --num-requests ${W3_REQUESTS:-24} --no-progress --json "$LOGS/prefix_W3.json" ;;
    offload)  # the CPU tier (`bench offload`): W7 whole, then W6 with OFFLOAD_W6_REQUESTS (default 200) requests, on
              # OFFLOAD_SHAPES (default qwen2.5-0.5b); OFFLOAD_ARGS go to both
      for shape in ${OFFLOAD_SHAPES:-qwen2.5-0.5b}; do
        # shellcheck disable=SC2086  # OFFLOAD_ARGS is a list of options
        run offload-W7-$shape '^(==|N |[0-9]|pinned)' $RI bench offload --model-shape $shape --workload W7 --no-progress --json "$LOGS/offload_W7_$shape.json" ${OFFLOAD_ARGS:-}
        # shellcheck disable=SC2086
        run offload-W6-$shape '^(==|h |[0-9])' $RI bench offload --model-shape $shape --workload W6 --num-requests ${OFFLOAD_W6_REQUESTS:-200} --no-progress --json "$LOGS/offload_W6_$shape.json" ${OFFLOAD_ARGS:-}
      done ;;
    kernels-fa3)  # `bench kernels --long-prefix`: a 1024-token chunk over 4k and 9k paged prefixes through roseinfer's
                  # prefill kernel, SDPA flash and vLLM's FA3, after the bundle's six chunks as for peers
      P=${PEERS_DIR:-.vb5}
      if [ ! -d /tmp/vsite/vllm ]; then run vllm-install 'checked|failed|mismatch|WARNING' bash "$P/install.sh"; fi
      run kernels-fa3 '.' env PYTHONPATH="/tmp/vsite:$PYTHONPATH" $RI bench kernels --long-prefix ;;
    offload-peers)  # `bench offload --peer vllm`: each configuration through roseinfer, then through vLLM 0.24's native CPU
                    # offloading (a process a configuration), for OFFLOAD_SHAPES (default qwen2.5-0.5b) and
                    # OFFLOAD_PEER_WORKLOADS (default W7; W6 runs OFFLOAD_W6_REQUESTS, default 200), after the bundle's
                    # six chunks as for peers (installed here unless /tmp/vsite has it); OFFLOAD_ARGS go to each
      P=${PEERS_DIR:-.vb5}
      if [ ! -d /tmp/vsite/vllm ]; then run vllm-install 'checked|failed|mismatch|WARNING' bash "$P/install.sh"; fi
      for shape in ${OFFLOAD_SHAPES:-qwen2.5-0.5b}; do
        for w in ${OFFLOAD_PEER_WORKLOADS:-W7}; do
          n=(); [ "$w" = W6 ] && n=(--num-requests "${OFFLOAD_W6_REQUESTS:-200}")
          # shellcheck disable=SC2086  # OFFLOAD_ARGS is a list of options
          run offload-vllm-$w-$shape '^(==|N |h |[0-9]|pinned|# vLLM|vLLM|the vLLM)' env PYTHONPATH="/tmp/vsite:$PYTHONPATH" \
            $RI bench offload --model-shape $shape --workload $w "${n[@]}" --peer vllm --no-progress --json "$LOGS/offload_vllm_${w}_$shape.json" ${OFFLOAD_ARGS:-}
        done
      done ;;
    peers)  # vLLM 0.24 beside roseinfer on W1 and W2 (PEERS_SHAPES), in one call (~8 min for both shapes). First
            # assemble /tmp/vbundle.tar from the bundle's six chunks, one device call each, right after one another
            # (shared/peers/vllm/README.md); PEERS_DIR holds that folder's install.sh and bench_w1_w2.py.
      P=${PEERS_DIR:-.vb5}
      run vllm-install 'checked|failed|mismatch|WARNING' bash "$P/install.sh"
      for shape in ${PEERS_SHAPES:-qwen2.5-0.5b llama-3.1-8b}; do
        config=(); [ "$shape" != qwen2.5-0.5b ] && config=(--config "roseinfer/models/configs/$shape.json")
        run vllm-$shape '^(W1|W2):' env VLLM_USE_FLASHINFER_SAMPLER=0 OUT="$LOGS" PYTHONPATH=/tmp/vsite python3 "$P/bench_w1_w2.py" "${config[@]}"
        mv -f "$LOGS/vllm_w1.json" "$LOGS/vllm_$shape.json" 2>/dev/null
        for w in W1 W2; do
          run $w-$shape "$REPORT" $RI bench throughput --model-shape $shape --workload $w --mode continuous --json "$LOGS/${w}_$shape.json"
        done
      done
      if [[ " ${PEERS_SHAPES:-llama-3.1-8b} " == *" llama-3.1-8b "* ]]; then
        run w2-llama-lof-512 "$REPORT" $RI bench throughput --model-shape llama-3.1-8b --workload W2 --mode continuous --admission-policy lof --max-num-batched-tokens 512 --json "$LOGS/W2-lof-512_llama-3.1-8b.json"
      fi
      python3 - "$LOGS" ${PEERS_SHAPES:-qwen2.5-0.5b llama-3.1-8b} <<'PY'
import json, os, sys
logs = sys.argv[1]
def load(name):
    path = os.path.join(logs, name)
    return json.load(open(path)) if os.path.exists(path) else None
print(f"{'shape':14} {'workload':12} {'vLLM out tok/s':>15} {'roseinfer':>10} {'ratio':>6}")
for shape in sys.argv[2:]:
    peer = load(f"vllm_{shape}.json") or {}
    for w in ("W1", "W2", "W2-lof-512"):
        ours = load(f"{w}_{shape}.json")
        if ours is None:
            continue
        mine = ours["results"]["continuous"]["completion_throughput"]
        theirs = peer.get(w[:2], {}).get("out_tok_s")
        ratio = f"{mine / theirs:.2f}x" if theirs else "-"
        print(f"{shape:14} {w:12} {theirs or 0:15,.0f} {mine:10,.0f} {ratio:>6}")
PY
      ;;
    kv-fp8)  # the KV cache in bf16 against fp8 (--kv-cache-dtype fp8): qwen decode steps, then W2 on KV_FP8_SHAPES
             # (llama under lof-512, its best schedule), with vLLM and its own fp8 cache beside where the peers'
             # bundle is installed (/tmp/vsite, from a peers call just before; PEERS_DIR as for peers).
             # KV_FP8_ROOFLINE=0 skips the decode steps, KV_FP8_SHAPES= (empty) the W2 runs.
      if [ "${KV_FP8_ROOFLINE:-1}" != 0 ]; then
        for kv in auto fp8; do
          run roofline-qwen-$kv '^(roofline|step|decode) ' $RI bench roofline --model-shape qwen2.5-0.5b --kv-cache-dtype $kv --batches 64,256 --prefill-tokens 512 --json "$LOGS/roofline_qwen_$kv.json"
        done
      fi
      P=${PEERS_DIR:-.vb5}
      if [ ! -d /tmp/vsite/vllm ] && [ -f /tmp/vbundle.tar ]; then run vllm-install 'checked|failed|mismatch|WARNING' bash "$P/install.sh"; fi
      for shape in ${KV_FP8_SHAPES-qwen3-0.6b llama-3.1-8b}; do
        policy=(); [ "$shape" = llama-3.1-8b ] && policy=(--admission-policy lof --max-num-batched-tokens 512)
        for kv in auto fp8; do
          run W2-$shape-$kv "$REPORT" $RI bench throughput --model-shape $shape --workload W2 --mode continuous "${policy[@]}" --kv-cache-dtype $kv --json "$LOGS/kvfp8_W2_${shape}_$kv.json"
        done
        if [ -d /tmp/vsite/vllm ]; then
          config=(); [ "$shape" != qwen2.5-0.5b ] && config=(--config "roseinfer/models/configs/$shape.json")
          run vllm-fp8-$shape '^(W1|W2):|kv_cache_dtype' env VLLM_USE_FLASHINFER_SAMPLER=0 OUT="$LOGS" PYTHONPATH=/tmp/vsite python3 scripts/vllm_kv_fp8.py "$P/bench_w1_w2.py" "${config[@]}"
          mv -f "$LOGS/vllm_w1.json" "$LOGS/vllm_fp8_$shape.json" 2>/dev/null
        fi
      done
      python3 - "$LOGS" ${KV_FP8_SHAPES-qwen3-0.6b llama-3.1-8b} <<'PY'
import json, os, sys
logs = sys.argv[1]
def load(name):
    path = os.path.join(logs, name)
    return json.load(open(path)) if os.path.exists(path) else None
for kv in ("auto", "fp8"):
    r = load(f"roofline_qwen_{kv}.json")
    for row in (r or {}).get("rows", []):
        if row.get("kind") == "decode" and "ms" in row:
            print(f"qwen2.5-0.5b decode b={row['batch']} ctx={row['context']} KV {kv}: {row['ms']:.3f} ms "
                  f"(steady {row.get('steady_ms', 0):.3f}), {row['x_floor']:.2f}x its floor")
print(f"{'shape':14} {'W2 out tok/s':>13} {'KV auto':>9} {'KV fp8':>9} {'fp8/auto':>9} {'vLLM fp8':>9} {'ours/vLLM':>10}")
for shape in sys.argv[2:]:
    tput = {kv: (load(f"kvfp8_W2_{shape}_{kv}.json") or {}).get("results", {}).get("continuous", {}).get(
        "completion_throughput") for kv in ("auto", "fp8")}
    peer = ((load(f"vllm_fp8_{shape}.json") or {}).get("W2") or {}).get("out_tok_s")
    a, f = tput["auto"] or 0, tput["fp8"] or 0
    gain = f"{f / a:.3f}x" if a and f else "-"
    vs = f"{f / peer:.2f}x" if peer and f else "-"
    print(f"{shape:14} {'':>13} {a:9,.0f} {f:9,.0f} {gain:>9} {peer or 0:9,.0f} {vs:>10}")
PY
      ;;
    gemv)  # batch-1 decode: the fused GEMV against cuBLAS + separate kernels, per GEMM and per step
      run sweep-gemv '^(#|llama|qwen|shape)' python3 scripts/sweep_gemv.py ${GEMV_SWEEP:---quick}
      for shape in llama-3.1-8b qwen2.5-0.5b; do
        for g in one-token-gemv no-one-token-gemv; do
          run roofline-b1-$shape-$g '^(roofline|step|decode) ' $RI bench roofline --model-shape $shape --batches 1 --contexts 1024 --prefill-tokens 512 --$g --json "$LOGS/roofline_b1_${shape}_$g.json"
        done
      done ;;
    fold)  # decode-only steps with and without the RMSNorm launches (norm weights folded), same lease
      for shape in qwen2.5-0.5b llama-3.1-8b; do
        for f in fold-norms no-fold-norms; do
          run roofline-$shape-$f '^(roofline|step|decode) ' $RI bench roofline --model-shape $shape --batches 16,64,256 --contexts 1024 --prefill-tokens 512 --$f --json "$LOGS/roofline_${shape}_$f.json"
        done
      done
      for f in fold-norms no-fold-norms fold-norms no-fold-norms; do
        run w1-qwen-$f "$REPORT" $RI bench throughput --model-shape qwen2.5-0.5b --workload W1 --mode continuous --no-roofline --$f --json "$LOGS/w1_qwen_$f.json"
      done ;;
    profile)
      # Any trace slows this host-paced run (CUPTI makes each graph launch dearer), so the busy share of
      # steady decode (b=64) is read as the kernel time of a step in a GPU-only trace over the untraced
      # run's median decode step (kernel durations do not depend on the host's pace).
      run w1-untraced "$REPORT|blocked|Decode-only" $RI bench throughput --model-shape qwen2.5-0.5b --workload W1 --mode continuous --no-roofline --json "$LOGS/w1_untraced.json"
      run profile-gpu-only "$REPORT|blocked|Decode-only" $RI bench throughput --model-shape qwen2.5-0.5b --workload W1 --mode continuous --no-roofline --profile /tmp/w1gpu.json --profile-gpu-only
      run trace-decode-busy '.' $RI trace-sql /tmp/w1gpu.continuous.json --example decode-busy
      run steady-decode-busy '.' python3 scripts/steady_decode_busy.py /tmp/w1gpu.continuous.json "$LOGS/w1_untraced.json"
      run trace-gpu-kernels '.' $RI trace-sql /tmp/w1gpu.continuous.json --example top-kernels
      $RI bench throughput --model-shape qwen2.5-0.5b --workload W1 --mode continuous --no-roofline --profile /tmp/w1trace.json > "$LOGS/profile.log" 2>&1
      run trace-ranges '.' $RI trace-sql /tmp/w1trace.continuous.json --example range-times
      run trace-gaps '.' $RI trace-sql /tmp/w1trace.continuous.json --example gpu-gaps
      run trace-kernels '.' $RI trace-sql /tmp/w1trace.continuous.json --example top-kernels ;;
    steps)  # W1's prefill and decode steps kernel by kernel, against their floors
      for shape in llama-3.1-8b qwen2.5-0.5b; do
        run steps-$shape '^(#|##|  *[0-9])' python3 scripts/probe_step_kernels.py --model-shape $shape
      done ;;
    mlp)  # the decode MLP as one persistent Triton launch (a no-go at 4b3acf8)
      run mlp '^(qwen|llama|  )' python3 scripts/probe_fused_mlp.py --batches 16,64 --stress 20 ;;
    pdl)  # a qwen layer's GEMM chain with PDL, every kernel ours (the probe behind pdl_decode)
      run pdl '^(qwen|  )' python3 scripts/probe_pdl_chain.py --quick --batches 64,16 --one-step-ks 512 ;;
    megakernel)  # every layer's GEMM chain in one launch, dependencies per tile (a no-go in the twenty-first session)
      run megakernel '^(qwen|  )' python3 scripts/probe_layer_megakernel.py --batches 64,32,16 --bns 32,16/32/64/32 --splits 1/1/1/8 --pps 3 --stages 4 ;;
    ncu)  # Nsight Compute counters of one graphed qwen decode step's first 20 kernels (twenty-second session)
      run ncu 'PROF. Report|Error' ncu --clock-control none --profile-from-start off --launch-count 20 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        -o "$LOGS/step64" -f python3 scripts/ncu_decode_step.py
      run ncu-table '.' ncu --import "$LOGS/step64.ncu-rep" --page raw --csv \
        --metrics gpu__time_duration.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active ;;
    pdl-decode)  # decode steps with and without the PDL chain (pdl_decode), two engines in one process
      run pdl-decode '^( |qwen|batch)' python3 scripts/ab_pdl_decode.py --batches 16,32,64 --engines pdl,plain ;;
    tail)  # a decode step's lm_head and sampler: in the chain, sampling in the GEMM's epilogue, against cuBLAS + sampler
      run tail-qwen '^( |qwen)' python3 scripts/ab_decode_tail.py --batches 16,32,64 --variants fused,unfused,torch-fill
      run tail-qwen-t06 '^( |qwen)' python3 scripts/ab_decode_tail.py --batches 64,80,128 --temperature 0.6 --variants fused,unfused
      run tail-llama '^( |llama)' python3 scripts/ab_decode_tail.py --model-shape llama-3.1-8b --batches 8,16,32,64 --captures 2 --rounds 3 --iters 30 --variants fused,unfused
      run logits-tiles '^( |rows|qwen)' python3 scripts/probe_logits_sample.py --rows 16,32,64 --temperature 0,0.6 ;;
    layouts)  # decode linears by weight layout and BLAS library (the down GEMM's cuBLASLt choice, 4b3acf8)
      run layouts '.' python3 scripts/probe_gemm_layouts.py --batches 16,64,128,256 ;;
    l2)  # warming L2 with the next weights on a side stream (a no-go at d255ae7)
      run l2-gemm '.' python3 scripts/probe_l2_prefetch.py gemm --prefetch bulk
      for v in "none 1" "bulk 1" "bulk 0" "none 1"; do
        set -- $v
        run l2-step-$1-$2 '^decode' python3 scripts/probe_l2_prefetch.py step --prefetch $1 --lead $2
      done ;;
    host)  # the host's side of a step: W1/W2 phases on the real engine, and each piece of a graphed launch
      run host-w1 '.' python3 scripts/host_step_time.py --workload W1 --device cuda --phases
      run host-w2 '.' python3 scripts/host_step_time.py --workload W2 --device cuda --phases
      run probe-host-launch '.' python3 scripts/probe_host_launch.py ;;
    *) echo "unknown section $s"; exit 2 ;;
  esac
done
archive
echo
echo "=== summary"
for s in "${summary[@]}"; do echo "  $s"; done
