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
import sys
import time
from typing import Any

from tqdm.auto import tqdm

from roseinfer.bench.prefix_common import format_table
from roseinfer.bench.prefix_online import poisson_offsets
from roseinfer.bench.serve_common import (
    PEER_COLUMNS,
    ServeResult,
    add_w8_stream_arguments,
    build_w8,
    w8_stream_flags,
)
from roseinfer.bench.vllm_peer import (
    engine_args,
    exit_peer_process,
    limit_flags,
    model_dir,
    peer_parser,
    remove_model_dir,
    set_vllm_env,
    write_peer_report,
)
from roseinfer.bench.workloads import Workload

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
    cmd = [sys.executable, "-m", "roseinfer.bench.serve_vllm", "--model", model]
    return cmd + w8_stream_flags(args, vocab_size, rates) + [*limit_flags(config), "--json", path]


def side_by_side(
    ours: list[dict[str, Any]], theirs: list[dict[str, Any]], names: tuple[str, str] = ("roseinfer", "vLLM")
) -> list[dict[str, Any]]:
    """Two rows a rate, ours (with its output tok/s over theirs) then theirs, named by `names`."""
    rows = []
    for mine, peer in zip(ours, theirs, strict=True):
        ratio = mine["output_tok_s"] / peer["output_tok_s"] if peer["output_tok_s"] else float("nan")
        rows.append(mine | {"engine": names[0], "x_peer": ratio})
        rows.append(peer | {"engine": names[1], "x_peer": None})
    return rows


# -- the peer's process ----------------------------------------------------------------------------------


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
        remove_model_dir(tmp)
    return report


def build_parser() -> argparse.ArgumentParser:
    p = peer_parser("roseinfer.bench.serve_vllm", __doc__)
    add_w8_stream_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    set_vllm_env()
    report = asyncio.run(serve_w8(args))
    print(format_table(f"vLLM {report['version']}, W8", PEER_COLUMNS, report["rows"]), flush=True)
    write_peer_report(args.json, report)
    return 0


if __name__ == "__main__":
    exit_peer_process(main)
