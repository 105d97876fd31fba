"""The vLLM side of `roseinfer bench serve --peer vllm`: W8 through vLLM's `AsyncLLM` in this process, on the same
requests, arrival times and stamps as roseinfer's run, so that the two stand in one table.

    PYTHONPATH=/tmp/vsite:$PWD python3 -m roseinfer.bench.serve_vllm --model qwen2.5-0.5b --rates 8,16,inf

It runs where vLLM imports (on the GPU machine, the bundle of `shared/peers/vllm/` installed into /tmp/vsite).
- The prompts are `build_w8`'s streams and the arrivals `poisson_offsets`' (stream k for the k-th rate, as
  `bench serve` draws them); the warm-up is stream 0, most requests at once and the last few alone, as
  `warm_up_online` runs roseinfer's.
- Each request is one task that sleeps until its arrival and reads vLLM's DELTA stream, stamping each output
  as it reaches the caller (`ServeResult.on_output`), as roseinfer's loop stamps a step's outputs when the
  step returns. vLLM's engine core runs in a process of its own: that is its design, and its cost.
- The model is built from the same config with dummy weights and no tokenizer (`skip_tokenizer_init`;
  roseinfer's built-in shapes have none either), under the batch limits, memory share and prefix-caching
  setting roseinfer ran with (the parent passes them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from tqdm.auto import tqdm

from roseinfer.bench.prefix_common import format_table
from roseinfer.bench.prefix_online import poisson_offsets
from roseinfer.bench.serve_common import PEER_COLUMNS, ServeResult, build_w8
from roseinfer.bench.workloads import Workload
from roseinfer.entrypoints.arg_types import arrival_rates, memory_fraction, positive_int
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
NUM_WARMUP_ALONE = 4
UNMEASURED = ("preemptions", "kv_usage_max", "max_step_ms", "compiles")  # roseinfer's engine-side columns


# -- the parent's side (`bench serve --peer vllm`) -------------------------------------------------------

COMPARE_COLUMNS = [
    ("rate", "rate req/s", "g"),
    ("engine", "engine", "s"),
    ("output_tok_s", "out tok/s", ".0f"),
    ("x_peer", "x vLLM", ".2f"),
    *(
        (f"{name}_{stat}_ms", f"{name.upper()} {stat} ms", ".1f")
        for name in ("ttft", "tpot", "itl")
        for stat in ("p50", "p99")
    ),
    ("e2e_p99_ms", "E2E p99 ms", ".0f"),
]


def peer_command(
    args: argparse.Namespace, model: str, vocab_size: int, rates: list[float], config: Any, path: str
) -> list[str]:
    """The `serve_vllm` command for the rates roseinfer ran, under the limits its engine ran with."""
    cmd = [
        sys.executable,
        "-m",
        "roseinfer.bench.serve_vllm",
        "--model",
        model,
        "--rates",
        ",".join(f"{r:g}" for r in rates),
        "--num-requests",
        str(args.num_requests),
        "--prompt-len",
        str(args.prompt_len),
        "--output-len",
        str(args.output_len),
        "--warmup-requests",
        str(args.warmup_requests),
        "--seed",
        str(args.seed),
        "--vocab-size",
        str(vocab_size),
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
        "--json",
        path,
    ]
    if config.max_model_len:
        cmd += ["--max-model-len", str(config.max_model_len)]
    if config.enforce_eager:
        cmd.append("--enforce-eager")
    if args.no_progress:
        cmd.append("--no-progress")
    return cmd


def run_peer_process(cmd: list[str], path: str) -> dict[str, Any]:
    """Runs the peer's command (its output passes through); its report, or {"error": ...} if it failed."""
    code = subprocess.run(cmd, check=False).returncode
    if code != 0 or not os.path.exists(path):
        return {"error": f"the vLLM peer exited with {code}: {' '.join(cmd)}"}
    with open(path) as f:
        return json.load(f)


def side_by_side(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two rows a rate, roseinfer's (with its output tok/s over vLLM's) then vLLM's."""
    rows = []
    for mine, peer in zip(ours, theirs, strict=True):
        ratio = mine["output_tok_s"] / peer["output_tok_s"] if peer["output_tok_s"] else float("nan")
        rows.append(mine | {"engine": "roseinfer", "x_peer": ratio})
        rows.append(peer | {"engine": "vLLM", "x_peer": None})
    return rows


# -- the peer's process ----------------------------------------------------------------------------------


def model_dir(model: str) -> tuple[str, str | None]:
    """A directory vLLM can build `model` from with dummy weights: the model's own, or (a built-in shape or a
    config file) a temporary one holding its config. Returns (directory, temporary directory to remove)."""
    path = resolve_model_path(model, need_weights=False)
    if os.path.isdir(path):
        return path, None
    tmp = tempfile.mkdtemp(prefix="roseinfer_vllm_")
    shutil.copyfile(path, os.path.join(tmp, "config.json"))
    return tmp, tmp


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


def sampling_params(vllm_params: Any, output_kind: Any, output_len: int) -> Any:
    """W8's request: greedy, exactly `output_len` tokens, token ids only."""
    return vllm_params(
        temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False, output_kind=output_kind
    )


async def serve_rate(
    engine: Any, workload: Workload, params: Any, offsets: Any, rate: float, tag: str, progress: bool = True
) -> ServeResult:
    """Request i arrives `offsets[i]` s after the start and streams through `engine.generate`; every output is
    stamped as it reaches this task."""
    n = workload.num_requests
    result = ServeResult(rate)
    start = time.monotonic() + 1e-3
    arrivals = (start + offsets).tolist()
    bar = tqdm(total=n, desc=f"vLLM W8 @ {rate:g} req/s", unit="req", disable=not progress, leave=False)

    async def one(i: int) -> None:
        delay = arrivals[i] - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        rid = f"{tag}-{i}"
        prompt = {"prompt_token_ids": workload.prompts[i]}
        async for out in engine.generate(prompt=prompt, sampling_params=params, request_id=rid):
            if result.on_output(
                rid, len(out.outputs[0].token_ids), out.finished, time.monotonic(), arrivals[i]
            ):
                bar.update(1)

    with bar:
        await asyncio.gather(*(one(i) for i in range(n)))
    result.wall_s = time.monotonic() - start
    return result


async def warm_up(engine: Any, workload: Workload, params: Any) -> None:
    """Most warm-up requests at once, the last few one at a time (the launch shapes an online run makes)."""
    n = workload.num_requests
    alone = min(NUM_WARMUP_ALONE, n - 1)

    async def drain(i: int) -> None:
        prompt = {"prompt_token_ids": workload.prompts[i]}
        async for _ in engine.generate(prompt=prompt, sampling_params=params, request_id=f"warm-{i}"):
            pass

    await asyncio.gather(*(drain(i) for i in range(n - alone)))
    for i in range(n - alone, n):
        await drain(i)


def peer_row(result: ServeResult) -> dict[str, Any]:
    """`ServeResult.row`, with roseinfer's engine-side columns (which vLLM does not report) left empty."""
    row = result.row()
    for key in UNMEASURED:
        row[key] = None
    return row


async def serve_w8(args: argparse.Namespace) -> dict[str, Any]:
    import vllm
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    lengths = {"prompt_len": args.prompt_len, "output_len": args.output_len, "seed": args.seed}
    streams = [
        build_w8(args.vocab_size, args.num_requests, k, **lengths) for k in range(1, len(args.rates) + 1)
    ]
    warm = build_w8(args.vocab_size, args.warmup_requests, 0, **lengths)
    directory, tmp = model_dir(args.model)
    kw = engine_args(args, directory)
    report: dict[str, Any] = {"peer": "vllm", "version": vllm.__version__, "engine_args": kw, "rows": []}
    started = time.monotonic()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
    try:
        report["init_s"] = time.monotonic() - started
        print(f"vLLM {vllm.__version__}: engine built in {report['init_s']:.1f} s", flush=True)
        await warm_up(engine, warm, sampling_params(SamplingParams, RequestOutputKind.FINAL_ONLY, 16))
        params = sampling_params(SamplingParams, RequestOutputKind.DELTA, args.output_len)
        for k, (rate, workload) in enumerate(zip(args.rates, streams), start=1):
            offsets = poisson_offsets(workload.num_requests, rate, args.seed, k)
            result = await serve_rate(
                engine, workload, params, offsets, rate, f"w8-{k}", not args.no_progress
            )
            report["rows"].append(peer_row(result))
    finally:
        engine.shutdown()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m roseinfer.bench.serve_vllm", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", required=True, help="a built-in shape, a config.json or an HF-format directory")
    p.add_argument("--rates", type=arrival_rates, required=True, help="the rates roseinfer ran, in its order")
    p.add_argument("--num-requests", type=positive_int, required=True)
    p.add_argument("--prompt-len", type=positive_int, required=True)
    p.add_argument("--output-len", type=positive_int, required=True)
    p.add_argument("--warmup-requests", type=positive_int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--vocab-size", type=positive_int, required=True, help="the vocabulary prompts are drawn from"
    )
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-num-seqs", type=positive_int, required=True)
    p.add_argument("--max-num-batched-tokens", type=positive_int, required=True)
    p.add_argument("--gpu-memory-utilization", type=memory_fraction, required=True)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, required=True)
    p.add_argument("--max-model-len", type=positive_int, default=None)
    p.add_argument("--block-size", type=positive_int, default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--json", required=True, metavar="PATH", help="where the rows go")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name, value in VLLM_ENV.items():
        os.environ.setdefault(name, value)
    report = asyncio.run(serve_w8(args))
    print(format_table(f"vLLM {report['version']}, W8", PEER_COLUMNS, report["rows"]), flush=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # vLLM's engine-core process and threads can hang an orderly interpreter exit
