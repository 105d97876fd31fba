"""The vLLM side of `roseinfer bench offload --peer vllm`: `run_vllm` (in the bench's process) starts this module once a
configuration; each run times that configuration's W6 and W7 points, on the same prompts, through vLLM's
`LLM.generate` in its process (vLLM's engine core runs in a process of its own).

    PYTHONPATH=/tmp/vsite:$PWD python3 -m roseinfer.bench.offload_vllm --model qwen2.5-0.5b --vocab-size 151936 \
        --max-num-seqs 256 --max-num-batched-tokens 1024 --gpu-memory-utilization 0.9 --enable-prefix-caching \
        --config gpu+cpu --workload W7 --kv-offloading-size 16 --json /tmp/vllm_offload.json

The configurations as vLLM has them: `none` without prefix caching, `gpu` with it, `gpu+cpu` with its native CPU
offloading (`kv_offloading_size`, the same GiB), and `cpu` as `gpu+cpu` with its GPU prefix cache reset before
every run, so that what an earlier run left is found in the CPU tier only (within a run, prompts share nothing).
A run's hit tokens are its outputs' `num_cached_tokens` (from the GPU cache and the CPU tier together; for `cpu`,
from the tier alone). Its stats stay off, as `LLM` has them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from roseinfer.bench.decode_steps import check_lengths
from roseinfer.bench.offload import (
    CONFIGS,
    DEFAULT_HIT_RATES,
    W7_OUTPUTS,
    bench_w6,
    bench_w7,
    parse_list,
    stage,
    warm_up,
)
from roseinfer.bench.vllm_peer import (
    engine_args,
    exit_peer_process,
    limit_flags,
    model_dir,
    peer_parser,
    remove_model_dir,
    run_peer,
    set_vllm_env,
    write_peer_report,
)
from roseinfer.config import EngineConfig
from roseinfer.entrypoints.arg_types import non_negative_float, positive_int


def peer_command(
    args: argparse.Namespace, model: str, vocab: int, config: EngineConfig, name: str, path: str
) -> list[str]:
    """The `offload_vllm` command for one configuration, the workloads and points roseinfer ran, under the limits
    its engine ran with."""
    cmd = [sys.executable, "-m", "roseinfer.bench.offload_vllm", "--model", model, "--vocab-size", str(vocab)]
    cmd += [*limit_flags(config), "--config", name, "--workload", args.workload]
    cmd += ["--kv-offloading-size", str(args.kv_offloading_size)]
    cmd += ["--hit-rates", ",".join(map(str, args.hit_rates)), "--outputs", ",".join(map(str, args.outputs))]
    for flag, value in (
        ("--num-requests", args.num_requests),
        ("--prompt-len", args.prompt_len),
        ("--output-len", args.output_len),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    cmd += ["--seed", str(args.seed), "--json", path]
    return cmd + (["--no-progress"] if args.no_progress else [])


def run_vllm(
    args: argparse.Namespace,
    model: str,
    vocab: int,
    config: EngineConfig,
    workloads: list[str],
    save: Callable[[dict[str, Any]], None] = lambda peer: None,
) -> dict[str, Any]:
    """Each configuration through vLLM, in a process of its own (a fresh engine and CPU pool each, as roseinfer's).
    Its rows by workload and configuration; "error" holds the first failure (the others still run). `save` runs
    after each configuration, given the dict filled so far."""
    peer: dict[str, Any] = {"version": None, "results": {w: {} for w in workloads}, "configs": {}}
    for name in args.configs:
        t0 = time.perf_counter()
        ran = run_peer(lambda path, name=name: peer_command(args, model, vocab, config, name, path))
        if "error" in ran:
            print(ran["error"], flush=True)
            peer.setdefault("error", ran["error"])
            continue
        peer["version"] = ran["version"]
        peer["configs"][name] = {k: v for k, v in ran.items() if k != "results"}
        rates = []
        for w in workloads:
            peer["results"][w][name] = ran["results"][w]
            rates += [f"{r['req_per_s']:.2f}" for r in ran["results"][w]]
        stage(f"vLLM {name}: done", t0, "req/s " + ", ".join(rates))
        save(peer)
    return peer


def vllm_engine_args(args: argparse.Namespace, directory: str) -> dict[str, Any]:
    kw = engine_args(args, directory)
    kw["enable_prefix_caching"] = args.config != "none"
    if "cpu" in args.config:
        kw["kv_offloading_size"] = args.kv_offloading_size
        kw["kv_offloading_backend"] = "native"
    return kw


class VllmTarget:
    """vLLM's `LLM` as `bench_w6`/`bench_w7` drive it."""

    def __init__(self, llm: Any, sampling_params: type, reset_gpu_before_runs: bool) -> None:
        self.llm, self.sampling_params = llm, sampling_params
        self.reset_gpu_before_runs = reset_gpu_before_runs

    def clear(self) -> None:
        if not self.llm.reset_prefix_cache(reset_connector=True):
            raise RuntimeError("vLLM refused to reset its prefix cache and CPU tier")

    def run(self, prompts: list[list[int]], max_tokens: int, trace: str | None = None) -> dict[str, Any]:
        # `trace` is never set here: the parent passes no --profile (vLLM's engine runs in a process of its own).
        if self.reset_gpu_before_runs and not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its GPU prefix cache")
        params = self.sampling_params(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False
        )
        t0 = time.perf_counter()
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        check_lengths([len(o.outputs[0].token_ids) for o in outs], max_tokens, "vLLM")
        return {"seconds": seconds, "hit_tokens": sum(o.num_cached_tokens or 0 for o in outs)}


def time_vllm(args: argparse.Namespace) -> dict[str, Any]:
    import vllm

    workloads = ["W6", "W7"] if args.workload == "all" else [args.workload]
    directory, tmp = model_dir(args.model)
    kw = vllm_engine_args(args, directory)
    report: dict[str, Any] = {"peer": "vllm", "version": vllm.__version__, "config": args.config}
    report["engine_args"] = kw
    try:
        started = time.monotonic()
        llm = vllm.LLM(**kw)
        report["init_s"] = time.monotonic() - started
        print(f"vLLM {vllm.__version__} {args.config}: engine built in {report['init_s']:.1f} s", flush=True)
        target = VllmTarget(llm, vllm.SamplingParams, reset_gpu_before_runs=args.config == "cpu")
        report["results"], report["warm_up_s"] = {}, {}
        for w in workloads:
            t0 = time.monotonic()
            warm_up(target, w, args, args.vocab_size)
            report["warm_up_s"][w] = time.monotonic() - t0
            bench = bench_w6 if w == "W6" else bench_w7
            report["results"][w] = bench(target, args, args.vocab_size, not args.no_progress)
    finally:
        remove_model_dir(tmp)
    return report


def build_parser() -> argparse.ArgumentParser:
    p = peer_parser("roseinfer.bench.offload_vllm", __doc__)
    p.add_argument("--config", required=True, choices=list(CONFIGS))
    p.add_argument("--workload", default="all", choices=["W6", "W7", "all"])
    p.add_argument("--kv-offloading-size", type=non_negative_float, default=16.0)
    p.add_argument("--hit-rates", type=parse_list(float), default=DEFAULT_HIT_RATES)
    p.add_argument("--outputs", type=parse_list(int), default=list(W7_OUTPUTS))
    p.add_argument("--num-requests", type=positive_int, default=None)
    p.add_argument("--prompt-len", type=positive_int, default=None)
    p.add_argument("--output-len", type=positive_int, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if "cpu" in args.config and args.kv_offloading_size <= 0:
        raise SystemExit("the gpu+cpu and cpu configurations need --kv-offloading-size > 0")
    set_vllm_env()
    report = time_vllm(args)
    for w, rows in report["results"].items():
        rates = ", ".join(f"{r['req_per_s']:.2f}" for r in rows)
        print(f"vLLM {args.config} {w}: req/s {rates}", flush=True)
    write_peer_report(args.json, report)
    return 0


if __name__ == "__main__":
    exit_peer_process(main)
