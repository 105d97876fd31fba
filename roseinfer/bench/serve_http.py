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
import math
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from roseinfer.bench.prefix_online import poisson_offsets
from roseinfer.bench.serve_common import (
    LATENCIES,
    ServeResult,
    add_w8_stream_arguments,
    build_w8,
    w8_stream_flags,
)
from roseinfer.bench.serve_vllm import COMPARE_COLUMNS
from roseinfer.bench.vllm_peer import run_peer_process, write_peer_report
from roseinfer.bench.workloads import Workload
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.arg_types import positive_int

# vLLM's side-by-side columns, the second row of a rate HTTP's, then each process's CPU.
HTTP_COLUMNS = [
    {"engine": ("engine", "driven", "s"), "x_peer": ("x_peer", "x HTTP", ".2f")}.get(column[0], column)
    for column in COMPARE_COLUMNS
] + [("server_cpu", "server CPU", ".0%"), ("engine_cpu", "engine CPU", ".0%"), ("client_cpu", "client CPU", ".0%")]


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds process `pid` has used, all its threads (Linux's /proc); None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_http(
    engine: LLMEngine | None,
    model: str,
    kwargs: dict[str, Any],
    args: argparse.Namespace,
    vocab: int,
    rates: list[float],
) -> dict[str, Any]:
    """Serves `engine` on a thread (`--http-engine thread`), else `LLM(model, **kwargs)` in a process of its own,
    and runs the client process over `rates` (W8's streams 1..len(rates)): its report, or {"error": ...}."""
    from roseinfer.engine.async_engine import AsyncLLMEngine
    from roseinfer.engine.engine_process import EngineProcess
    from roseinfer.entrypoints.openai.server_thread import ServerThread

    engine_pid: list[str] = []
    if engine is not None:
        online: AsyncLLMEngine | EngineProcess = AsyncLLMEngine(engine)
        where = "the engine on a thread of the server's process"
    else:
        try:
            online = EngineProcess(model, **kwargs)
        except Exception as e:
            return {"error": f"the engine process did not start: {e}"}
        where, engine_pid = "the engine in its own process", ["--engine-pid", str(online.pid)]
    with ServerThread(online, "w8") as server, tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "http.json")
        cmd = [sys.executable, "-m", "roseinfer.bench.serve_http", "--url", server.url, *engine_pid,
               "--client-procs", str(args.http_clients), "--json", path, *w8_stream_flags(args, vocab, rates)]  # fmt: skip
        report = run_peer_process(cmd, path)
    report["serving"] = f"{where}; {report.get('client', 'no')} client"
    if "error" in report:
        report["error"] = report["error"].replace("the vLLM peer", "the HTTP client")
    return report


# -- the client's process ---------------------------------------------------------------------------------


@dataclass
class Share:
    """What one of the client's worker processes sends: its requests and their arrival times (monotonic
    seconds, a clock every process of the machine shares)."""

    url: str
    prompts: list[list[int]]
    max_tokens: int
    arrivals: list[float]


async def send(
    client: Any, prompt: list[int], max_tokens: int, rid: str, arrival: float, result: ServeResult
) -> bool:
    """One request, streamed: each chunk's tokens stamped into `result` as it arrives. True once finished."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}  # fmt: skip
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{rid}: HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"{rid}: {chunk['error']['message']}")
            choice = chunk["choices"][0]
            done = choice["finish_reason"] is not None
            if result.on_output(rid, len(choice["token_ids"]), done, time.monotonic(), arrival):
                return True
    return False


async def _run_share(share: Share) -> dict[str, Any]:
    import httpx

    result, cpu0 = ServeResult(0.0), time.process_time()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=share.url, timeout=None, limits=limits) as client:

        async def one(j: int) -> None:
            await asyncio.sleep(max(0.0, share.arrivals[j] - time.monotonic()))
            await send(client, share.prompts[j], share.max_tokens, f"r{j}", share.arrivals[j], result)

        await asyncio.gather(*(one(j) for j in range(len(share.prompts))))
    lists = {name: getattr(result, name) for name in LATENCIES}
    return lists | {"tokens": result.output_tokens, "end": time.monotonic(), "cpu_s": time.process_time() - cpu0}


def run_share(share: Share) -> dict[str, Any]:
    """A worker process's share of a rate: its latencies, tokens, end time and CPU seconds."""
    return asyncio.run(_run_share(share))


def http_rate(
    pool: Executor, url: str, workload: Workload, offsets: Any, rate: float, procs: int, engine_pid: int | None
) -> tuple[ServeResult, dict[str, float | None]]:
    """Request i sent `offsets[i]` s after the start (its arrival, from which TTFT and E2E count), by worker
    i % procs. The row also has the CPU the server's process (this one's parent), the engine's process (where
    it has one) and the workers used, as shares of the wall time: one core is 100%, about what one
    interpreter's lock lets a process use."""
    max_tokens = workload.params[0].max_tokens or 1
    server0, t0 = process_cpu_s(os.getppid()), time.monotonic()
    engine0 = process_cpu_s(engine_pid) if engine_pid else None
    start = t0 + 0.05 * procs  # the shares reach their workers before the first arrival
    shares = [
        Share(url, workload.prompts[w::procs], max_tokens, [start + float(o) for o in offsets[w::procs]])
        for w in range(procs)
    ]
    parts = list(pool.map(run_share, shares))
    result = ServeResult(rate, output_tokens=sum(p["tokens"] for p in parts))
    for name in LATENCIES:
        setattr(result, name, [x for p in parts for x in p[name]])
    result.wall_s = max(p["end"] for p in parts) - start
    span = max(p["end"] for p in parts) - t0
    server_end, engine_end = process_cpu_s(os.getppid()), process_cpu_s(engine_pid) if engine_pid else None
    cpu = {
        "server_cpu": None if server0 is None or server_end is None else (server_end - server0) / span,
        "engine_cpu": None if engine0 is None or engine_end is None else (engine_end - engine0) / span,
        "client_cpu": sum(p["cpu_s"] for p in parts) / result.wall_s,
    }
    return result, cpu


def client_main(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    lengths = {"prompt_len": args.prompt_len, "output_len": args.output_len, "seed": args.seed}
    procs = args.client_procs
    with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
        warm = build_w8(args.vocab_size, args.warmup_requests, 0, **lengths)
        http_rate(pool, args.url, warm, np.zeros(warm.num_requests), math.inf, procs, args.engine_pid)
        rows = []
        for k, rate in enumerate(tqdm(args.rates, desc="W8 HTTP", unit="rate", disable=args.no_progress)):
            workload = build_w8(args.vocab_size, args.num_requests, k + 1, **lengths)
            offsets = poisson_offsets(workload.num_requests, rate, args.seed, k + 1)
            result, cpu = http_rate(pool, args.url, workload, offsets, rate, procs, args.engine_pid)
            rows.append(result.row() | cpu)
    return {"rows": rows, "client": f"{procs} processes of httpx {httpx.__version__}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m roseinfer.bench.serve_http", description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    add_w8_stream_arguments(p)
    p.add_argument("--vocab-size", type=positive_int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--json", required=True, metavar="PATH")
    p.add_argument("--client-procs", type=positive_int, default=4)
    p.add_argument("--engine-pid", type=int, default=None, help="the engine's process, where it has its own")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    write_peer_report(args.json, client_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
