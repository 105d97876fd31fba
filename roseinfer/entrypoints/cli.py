"""`roseinfer generate ...`, `roseinfer serve ...` and `roseinfer bench <name> ...`.

Bench subcommands live in their own modules and are listed in `BENCH_COMMANDS` (name -> module, help).
A bench module defines `add_arguments(parser)` and `run(args) -> int`; adding one is one line here, or a
call to `register_bench_command` before `main` runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from roseinfer.config import DTYPE_CHOICES
from roseinfer.entrypoints.arg_types import (
    additive_penalty,
    logit_bias_map,
    logprob_count,
    memory_fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    power_of_two,
    token_ids,
    torch_device,
    truncate_count,
)
from roseinfer.entrypoints.logprob_text import logprob_lines
from roseinfer.kv.cache_dtype import KV_CACHE_DTYPES
from roseinfer.scheduler.policy import POLICIES

if TYPE_CHECKING:
    from roseinfer.entrypoints.llm import LLM

# name -> (module defining add_arguments(parser) and run(args) -> int, one-line help)
BENCH_COMMANDS: dict[str, tuple[str, str]] = {
    "kernels": (
        "roseinfer.bench.kernels",
        "decode/prefill attention kernels vs bandwidth and SDPA flash (GPU)",
    ),
    "fused": (
        "roseinfer.bench.fused_ops",
        "RMSNorm+residual, SiLU-and-mul, rotary: Triton vs torch eager vs torch.compile (GPU)",
    ),
    "roofline": (
        "roseinfer.bench.roofline",
        "decode and prefill step times as multiples of the hardware floor (GPU)",
    ),
    "decode": (
        "roseinfer.bench.decode_steps",
        "a full batch's decode step through generate, against the floor and vLLM (--peer vllm)",
    ),
    "throughput": (
        "roseinfer.bench.throughput",
        "offline throughput of a workload; naive/static/continuous; HF peer",
    ),
    "prefix": ("roseinfer.bench.prefix", "prefix caching on vs off: W4, W3 online, W5 COW, cow-micro, W2"),
    "offload": ("roseinfer.bench.offload", "the CPU tier: W6 hit-rate sweep, W7 long-prompt rounds, per cache config"),
    "serve": (
        "roseinfer.bench.serve",
        "W8 online serving: TTFT, TPOT, ITL, E2E by arrival rate, to saturation",
    ),
    "plot": ("roseinfer.bench.plots", "draw a saved roofline or prefix report (--json) as PNG plots"),
}


def register_bench_command(name: str, module: str, help: str) -> None:
    BENCH_COMMANDS[name] = (module, help)


def _bench_module(name: str) -> ModuleType:
    module = importlib.import_module(BENCH_COMMANDS[name][0])
    for attr in ("add_arguments", "run"):
        if not callable(getattr(module, attr, None)):
            raise TypeError(f"bench module {module.__name__} must define {attr}()")
    return module


# -- generate --------------------------------------------------------------------------------------


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="HF directory, hub id, config.json or built-in shape (default: tiny-llama, dummy weights)",
    )
    parser.add_argument("--load-format", default=None, choices=["auto", "dummy"])
    parser.add_argument("--tokenizer", default=None)


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default=None, help="prompt text (needs a tokenizer)")
    prompt.add_argument("--prompt-ids", type=token_ids, default=None, help="comma-separated token ids")
    parser.add_argument("--max-tokens", type=positive_int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument(
        "--stop", action="append", default=None, help="a stop string (repeatable; needs a tokenizer)"
    )
    parser.add_argument(
        "--stop-token-ids", type=token_ids, default=[], help="comma-separated ids that stop it"
    )
    parser.add_argument(
        "--min-tokens",
        type=non_negative_int,
        default=0,
        help="tokens before a stop id, eos or stop string counts",
    )
    parser.add_argument(
        "--logprobs",
        type=logprob_count,
        default=None,
        help="print each generated token's logprob and rank, and the K most likely tokens (-1: all)",
    )
    parser.add_argument(
        "--prompt-logprobs",
        type=logprob_count,
        default=None,
        help="print each prompt token's logprob and rank, and the K most likely tokens there (-1: all)",
    )
    parser.add_argument(
        "--presence-penalty",
        type=additive_penalty,
        default=0.0,
        help="subtracted from the logit of each id already in the output, in [-2, 2]",
    )
    parser.add_argument(
        "--frequency-penalty",
        type=additive_penalty,
        default=0.0,
        help="times an id's count in the output, subtracted from its logit, in [-2, 2]",
    )
    parser.add_argument(
        "--repetition-penalty",
        type=positive_float,
        default=1.0,
        help="divides a positive logit of each id in the prompt or output, multiplies another; 1: off",
    )
    parser.add_argument(
        "--allowed-token-ids", type=token_ids, default=None, help="comma-separated ids, the only ones drawn"
    )
    parser.add_argument(
        "--logit-bias", type=logit_bias_map, default=None, help="ID=BIAS,... added to those ids' logits"
    )
    parser.add_argument(
        "--bad-words",
        action="append",
        default=None,
        help="a word never generated (repeatable; needs a tokenizer)",
    )
    parser.add_argument(
        "--truncate-prompt-tokens",
        type=truncate_count,
        default=None,
        help="keep only the prompt's last K tokens (-1: the model's context)",
    )
    add_engine_arguments(parser)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, type=torch_device)
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES)
    parser.add_argument("--block-size", type=power_of_two, default=16)
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=sorted(KV_CACHE_DTYPES),
        help="KV cache element type: auto (the model's) or fp8 (= fp8_e4m3) / fp8_e5m2",
    )
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument(
        "--gpu-memory-utilization",
        type=memory_fraction,
        default=0.9,
        help="share of the GPU's memory the engine takes, its KV cache included",
    )
    parser.add_argument(
        "--num-kv-blocks",
        type=positive_int,
        default=None,
        help="KV cache blocks (default: sized from the memory)",
    )
    cache = parser.add_argument_group("prefix cache")
    cache.add_argument("--no-prefix-caching", action="store_true", help="turn the prefix cache off")
    cache.add_argument(
        "--pin-prefix", action="append", default=[], help="a prefix to compute and pin (repeatable)"
    )
    cache.add_argument("--pin-prefix-file", default=None, help="JSON list or JSON lines of prefixes to pin")
    cache.add_argument(
        "--kv-offloading-size",
        type=non_negative_float,
        default=0.0,
        help="GiB of pinned host memory for the CPU tier below the GPU prefix cache (0: none)",
    )
    cache.add_argument(
        "--admission-policy",
        default="fcfs",
        choices=POLICIES,
        help="waiting-queue order: fcfs, lpm (longest cached prefix first), lof (longest max_tokens first)",
    )


def model_and_format(args: argparse.Namespace) -> tuple[str, str]:
    """The model to load and its load format: the built-in default's dummy weights where none is named."""
    from roseinfer.models.loader import DEFAULT_MODEL

    return args.model or DEFAULT_MODEL, args.load_format or ("auto" if args.model else "dummy")


def llm_kwargs(args: argparse.Namespace, **extra: object) -> tuple[str, dict[str, object]]:
    """The model and the `LLM` keywords that `add_model_arguments` and `add_engine_arguments`' options (and
    `extra`) give."""
    model, load_format = model_and_format(args)
    kwargs = dict(
        load_format=load_format,
        tokenizer=args.tokenizer,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_kv_blocks=args.num_kv_blocks,
        enable_prefix_caching=not args.no_prefix_caching,
        kv_offloading_size=args.kv_offloading_size,
        pinned_prefixes=args.pin_prefix,
        pin_prefix_file=args.pin_prefix_file,
        admission_policy=args.admission_policy,
    )
    return model, kwargs | extra


def llm_from_args(args: argparse.Namespace, **extra: object) -> LLM:
    from roseinfer.entrypoints.llm import LLM

    model, kwargs = llm_kwargs(args, **extra)
    return LLM(model, **kwargs)  # type: ignore[arg-type]


def run_generate(args: argparse.Namespace) -> int:
    from roseinfer.sampling_params import SamplingParams

    model, load_format = model_and_format(args)
    llm = llm_from_args(args)
    if args.prompt is not None:
        if llm.tokenizer is None:
            raise ValueError(f"{model!r} has no tokenizer; give --prompt-ids or --tokenizer")
        prompt: str | list[int] = args.prompt
    elif args.prompt_ids is not None:
        prompt = args.prompt_ids
    elif llm.tokenizer is not None:
        prompt = "Hello, my name is"
    else:
        prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
        stop=args.stop,
        stop_token_ids=args.stop_token_ids,
        min_tokens=args.min_tokens,
        logprobs=args.logprobs,
        prompt_logprobs=args.prompt_logprobs,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty,
        allowed_token_ids=args.allowed_token_ids,
        logit_bias=args.logit_bias,
        bad_words=args.bad_words,
        truncate_prompt_tokens=args.truncate_prompt_tokens,
    )
    result = llm.generate([prompt], params, use_tqdm=False)[0]
    out = result.outputs[0]
    device = llm.engine.config.device
    print(
        f"# {model} ({load_format} weights) on {device}; finish_reason={out.finish_reason}", file=sys.stderr
    )
    print(f"# {llm.engine.core.startup.line()}", file=sys.stderr)
    if llm.tokenizer is not None:
        print(out.text)
    else:
        print(",".join(str(t) for t in out.token_ids))
    if result.prompt_logprobs is not None:
        print("\n".join(logprob_lines("prompt_logprobs", result.prompt_token_ids, result.prompt_logprobs)))
    if out.logprobs is not None:
        print("\n".join(logprob_lines("logprobs", out.token_ids, out.logprobs)))
    return 0


# -- main ------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="roseinfer", description="roseinfer: LLM inference engine")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="complete one prompt")
    add_generate_arguments(gen)
    gen.set_defaults(func=run_generate)

    from roseinfer.entrypoints.serve_cli import add_serve_arguments, run_serve

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the [serve] extra)")
    add_serve_arguments(serve)
    serve.set_defaults(func=run_serve)

    from roseinfer.trace_sql import add_trace_sql_parser

    add_trace_sql_parser(sub)

    bench = sub.add_parser("bench", help="benchmarks (WORKLOADS.md)")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    for name, (_, help_text) in BENCH_COMMANDS.items():
        module = _bench_module(name)
        p = bench_sub.add_parser(name, help=help_text)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = ["roseinfer", *argv]  # the command line as the user typed it, for bench headers
    try:
        return int(args.func(args) or 0)
    except ValueError as e:  # bad input the engine refused by name: its message, not a traceback
        if os.environ.get("ROSEINFER_TRACEBACK", "0") not in ("", "0"):
            raise
        message = " ".join(str(e).splitlines())  # one line, though a wrapped error's message spans several
        print(
            f"roseinfer {args.command}: error: {message} (ROSEINFER_TRACEBACK=1 shows where)", file=sys.stderr
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
