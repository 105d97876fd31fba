"""`bench serve --http`: W8's rates again, through the OpenAI server this time, to show what HTTP costs.

The engine `bench serve` just ran in-process is served (`ServerThread`: uvicorn and the engine thread in the
bench's process), and a client of its own process (this module's `main`, so that its parsing does not share the
server's interpreter) sends the same requests at the same arrival times as streamed `/v1/completions` (token ids,
greedy, ignore_eos, `return_token_ids`), stamping each chunk as it arrives. The rows are W8's (`ServeResult`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from typing import Any

from tqdm.auto import tqdm

from roseinfer.bench.prefix_online import poisson_offsets
from roseinfer.bench.serve_common import ServeResult, build_w8
from roseinfer.bench.vllm_peer import run_peer_process, write_peer_report
from roseinfer.bench.workloads import Workload
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.arg_types import arrival_rates, positive_int

HTTP_COLUMNS = [
    ("rate", "rate req/s", "g"),
    ("engine", "driven", "s"),
    ("output_tok_s", "out tok/s", ".0f"),
    ("x_peer", "x HTTP", ".2f"),
    *(
        (f"{name}_{stat}_ms", f"{name.upper()} {stat} ms", ".1f")
        for name in ("ttft", "tpot", "itl")
        for stat in ("p50", "p99")
    ),
    ("e2e_p99_ms", "E2E p99 ms", ".0f"),
]


def run_http(engine: LLMEngine, args: argparse.Namespace, vocab: int, rates: list[float]) -> dict[str, Any]:
    """Serves `engine` and runs the client process over `rates` (W8's streams 1..len(rates)): its report, or
    {"error": ...}."""
    from roseinfer.entrypoints.openai.server_thread import ServerThread

    with ServerThread(engine, "w8") as server, tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "http.json")
        cmd = [sys.executable, "-m", "roseinfer.bench.serve_http", "--url", server.url,
               "--rates", ",".join(f"{r:g}" for r in rates), "--vocab-size", str(vocab),
               "--num-requests", str(args.num_requests), "--prompt-len", str(args.prompt_len),
               "--output-len", str(args.output_len), "--warmup-requests", str(args.warmup_requests),
               "--seed", str(args.seed), "--json", path, *(["--no-progress"] if args.no_progress else [])]  # fmt: skip
        report = run_peer_process(cmd, path)
    if "error" in report:
        report["error"] = report["error"].replace("the vLLM peer", "the HTTP client")
    return report


# -- the client's process ---------------------------------------------------------------------------------


def request_body(workload: Workload, i: int) -> dict[str, Any]:
    return {"prompt": workload.prompts[i], "max_tokens": workload.params[i].max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}  # fmt: skip


async def send(client: Any, workload: Workload, i: int, arrival: float, result: ServeResult | None) -> bool:
    """Request i, streamed: each chunk's tokens stamped into `result` (None: a warm-up). True once finished."""
    rid = f"w8-{i}"
    async with client.stream("POST", "/v1/completions", json=request_body(workload, i)) as response:
        if response.status_code != 200:
            raise RuntimeError(f"request {i}: HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"request {i}: {chunk['error']['message']}")
            choice = chunk["choices"][0]
            done = choice["finish_reason"] is not None
            if result is not None and result.on_output(rid, len(choice["token_ids"]), done, time.monotonic(), arrival):
                return True
    return result is None


async def http_rate(client: Any, workload: Workload, offsets: Any, rate: float, progress: bool) -> ServeResult:
    """Request i sent `offsets[i]` s after the start (its arrival, from which TTFT and E2E count)."""
    result = ServeResult(rate)
    start = time.monotonic() + 1e-3
    bar = tqdm(total=workload.num_requests, desc=f"W8 HTTP @ {rate:g} req/s", unit="req", disable=not progress,
               leave=False)  # fmt: skip

    async def one(i: int) -> None:
        arrival = start + float(offsets[i])
        await asyncio.sleep(max(0.0, arrival - time.monotonic()))
        if await send(client, workload, i, arrival, result):
            bar.update(1)

    with bar:
        await asyncio.gather(*(one(i) for i in range(workload.num_requests)))
    result.wall_s = time.monotonic() - start
    return result


async def client_main(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    lengths = {"prompt_len": args.prompt_len, "output_len": args.output_len, "seed": args.seed}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=args.url, timeout=None, limits=limits) as client:
        warm = build_w8(args.vocab_size, args.warmup_requests, 0, **lengths)
        await asyncio.gather(*(send(client, warm, i, 0.0, None) for i in range(warm.num_requests)))
        rows = []
        for k, rate in enumerate(args.rates):
            workload = build_w8(args.vocab_size, args.num_requests, k + 1, **lengths)
            offsets = poisson_offsets(workload.num_requests, rate, args.seed, k + 1)
            rows.append((await http_rate(client, workload, offsets, rate, not args.no_progress)).row())
    return {"rows": rows, "client": f"httpx {httpx.__version__}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m roseinfer.bench.serve_http", description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--rates", type=arrival_rates, required=True)
    p.add_argument("--vocab-size", type=positive_int, required=True)
    p.add_argument("--num-requests", type=positive_int, required=True)
    p.add_argument("--prompt-len", type=positive_int, required=True)
    p.add_argument("--output-len", type=positive_int, required=True)
    p.add_argument("--warmup-requests", type=positive_int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--json", required=True, metavar="PATH")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    write_peer_report(args.json, asyncio.run(client_main(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
