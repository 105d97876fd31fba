"""What every `--peer vllm` benchmark shares: vLLM in a process of its own (it runs where vLLM imports: on the GPU
machine, the bundle of `shared/peers/vllm/` installed into /tmp/vsite), built from the same model config with dummy
weights and no tokenizer, under the limits roseinfer's engine ran with (the parent passes them as flags)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any, NoReturn

from roseinfer.config import EngineConfig
from roseinfer.entrypoints.arg_types import memory_fraction, positive_int
from roseinfer.models.loader import resolve_model_path

# Set before vLLM is imported: FlashInfer is not in the bundle (its sampler would be probed), and the machine
# has no network.
VLLM_ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def set_vllm_env() -> None:
    for name, value in VLLM_ENV.items():
        os.environ.setdefault(name, value)


def limit_flags(config: EngineConfig) -> list[str]:
    """The peer's command-line flags for the limits roseinfer's engine ran with (`add_limit_arguments` reads them)."""
    flags = [
        "--dtype",
        str(config.dtype).removeprefix("torch."),
        "--max-num-seqs",
        str(config.scheduler.max_num_seqs),
        "--max-num-batched-tokens",
        str(config.scheduler.max_num_batched_tokens),
        "--gpu-memory-utilization",
        str(config.cache.gpu_memory_utilization),
        "--enable-prefix-caching" if config.cache.enable_prefix_caching else "--no-enable-prefix-caching",
        "--block-size",
        str(config.cache.block_size),
        "--kv-cache-dtype",
        config.cache.kv_cache_dtype,
    ]
    if config.max_model_len:
        flags += ["--max-model-len", str(config.max_model_len)]
    if config.enforce_eager:
        flags.append("--enforce-eager")
    return flags


def add_peer_option(parser: argparse.ArgumentParser, what: str) -> None:
    """A bench command's `--peer vllm`: `what` says what the peer then runs."""
    parser.add_argument(
        "--peer",
        choices=["vllm"],
        default=None,
        help=f"then run {what} through vLLM (it must import: PYTHONPATH=/tmp/vsite:...)",
    )


def peer_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A peer process's parser: the model, the vocabulary its prompts come from, roseinfer's limits (`limit_flags`),
    where the report goes; the command adds its own."""
    p = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc.splitlines()[0])
    p.add_argument("--model", required=True, help="a built-in shape, a config.json or an HF-format directory")
    p.add_argument(
        "--vocab-size", type=positive_int, required=True, help="the vocabulary prompts are drawn from"
    )
    p.add_argument("--json", required=True, metavar="PATH", help="where the rows go")
    p.add_argument("--no-progress", action="store_true")
    add_limit_arguments(p)
    return p


def write_peer_report(path: str, report: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=2)


def exit_peer_process(main: Callable[[], int]) -> NoReturn:
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # vLLM's engine-core process and threads can hang an orderly interpreter exit


def add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """The peer process's engine limits and seed (`limit_flags` writes them, `engine_args` reads them)."""
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-num-seqs", type=positive_int, required=True)
    p.add_argument("--max-num-batched-tokens", type=positive_int, required=True)
    p.add_argument("--gpu-memory-utilization", type=memory_fraction, required=True)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, required=True)
    p.add_argument("--max-model-len", type=positive_int, default=None)
    p.add_argument("--block-size", type=positive_int, default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--enforce-eager", action="store_true")


def engine_args(args: argparse.Namespace, directory: str) -> dict[str, Any]:
    """vLLM's engine arguments: the model, dummy weights, no tokenizer, and roseinfer's limits."""
    kw: dict[str, Any] = {
        "model": directory,
        "load_format": "dummy",
        "dtype": args.dtype,
        "skip_tokenizer_init": True,
        "seed": args.seed,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "enable_prefix_caching": args.enable_prefix_caching,
        "enforce_eager": args.enforce_eager,
        "kv_cache_dtype": args.kv_cache_dtype,
    }
    if args.max_model_len is not None:
        kw["max_model_len"] = args.max_model_len
    if args.block_size is not None:
        kw["block_size"] = args.block_size
    return kw


def model_dir(model: str) -> tuple[str, str | None]:
    """A directory vLLM can build `model` from with dummy weights: the model's own, or (a built-in shape or a
    config file) a temporary one holding its config. Returns (directory, temporary directory to remove)."""
    path = resolve_model_path(model, need_weights=False)
    if os.path.isdir(path):
        return path, None
    tmp = tempfile.mkdtemp(prefix="roseinfer_vllm_")
    shutil.copyfile(path, os.path.join(tmp, "config.json"))
    return tmp, tmp


def remove_model_dir(tmp: str | None) -> None:
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


def run_peer(command: Callable[[str], list[str]]) -> dict[str, Any]:
    """Runs `command(path)`, a peer process that writes its report to `path` (a temporary file): the report, or
    {"error": ...} if it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "vllm.json")
        return run_peer_process(command(path), path)


def peer_failed(report: dict[str, Any]) -> bool:
    """Whether a bench report's peer ran and failed (its command then exits 1, roseinfer's figures kept)."""
    return "error" in report.get("peer", {})


def run_peer_process(cmd: list[str], path: str) -> dict[str, Any]:
    """Runs the peer's command (its output passes through); its report, or {"error": ...} if it failed."""
    code = subprocess.run(cmd, check=False).returncode
    if code != 0 or not os.path.exists(path):
        return {"error": f"the vLLM peer exited with {code}: {' '.join(cmd)}"}
    with open(path) as f:
        return json.load(f)
