"""The vLLM side of `roseinfer bench decode --peer vllm`: the same cells, prompts and window, timed through vLLM's
`LLM.generate` in this process (its engine core runs in a process of its own, as vLLM builds it).

    PYTHONPATH=/tmp/vsite:$PWD python3 -m roseinfer.bench.decode_steps_vllm --model qwen2.5-0.5b --batches 64 \
        --contexts 1024 --vocab-size 151936 --max-num-seqs 64 --max-num-batched-tokens 16384 \
        --gpu-memory-utilization 0.9 --no-enable-prefix-caching --json /tmp/vllm_decode.json

The parent passes the limits roseinfer's engine ran with (`vllm_peer.limit_flags`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from roseinfer.bench.decode_steps import Generate, Window, check_lengths, int_list, measure_steps
from roseinfer.bench.vllm_peer import (
    engine_args,
    exit_peer_process,
    model_dir,
    peer_parser,
    remove_model_dir,
    set_vllm_env,
    write_peer_report,
)
from roseinfer.entrypoints.arg_types import positive_int


def vllm_generate(llm: Any, sampling_params: Any) -> Generate:
    def generate(prompts: list[list[int]], max_tokens: int) -> None:
        params = sampling_params(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        check_lengths([len(o.outputs[0].token_ids) for o in outs], max_tokens, "vLLM")

    return generate


def time_vllm(args: argparse.Namespace) -> dict[str, Any]:
    import vllm

    window = Window(args.short, args.long)
    directory, tmp = model_dir(args.model)
    kw = engine_args(args, directory)
    report: dict[str, Any] = {"peer": "vllm", "version": vllm.__version__, "engine_args": kw}
    try:
        started = time.monotonic()
        llm = vllm.LLM(**kw)
        report["init_s"] = time.monotonic() - started
        print(f"vLLM {vllm.__version__}: engine built in {report['init_s']:.1f} s", flush=True)
        report["rows"] = measure_steps(
            vllm_generate(llm, vllm.SamplingParams),
            args.vocab_size,
            args.batches,
            args.contexts,
            window,
            args.repeats,
            args.seed,
            "vLLM decode steps",
            not args.no_progress,
        )
    finally:
        remove_model_dir(tmp)
    return report


def build_parser() -> argparse.ArgumentParser:
    p = peer_parser("roseinfer.bench.decode_steps_vllm", __doc__)
    p.add_argument("--batches", type=int_list, required=True)
    p.add_argument("--contexts", type=int_list, required=True)
    p.add_argument("--short", type=positive_int, default=32)
    p.add_argument("--long", type=positive_int, default=160)
    p.add_argument("--repeats", type=positive_int, default=3)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    set_vllm_env()
    report = time_vllm(args)
    for row in report["rows"]:
        print(
            f"vLLM decode b={row['batch']} ctx={row['context']}: {row['step_ms']:.3f} ms a step", flush=True
        )
    write_peer_report(args.json, report)
    return 0


if __name__ == "__main__":
    exit_peer_process(main)
