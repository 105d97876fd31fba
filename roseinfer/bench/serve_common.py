"""What every W8 (serve-random) run shares, whichever engine serves it: the requests of a stream, the stamps of
their streamed outputs (`ServeResult.on_output`) and the latencies they make, and the table's columns."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roseinfer.bench.prefix_common import percentile
from roseinfer.bench.workloads import Workload, token_id_range
from roseinfer.entrypoints.arg_types import arrival_rates, positive_int
from roseinfer.sampling_params import RequestOutputKind, SamplingParams

W8_PROMPT_LEN = 512
W8_OUTPUT_LEN = 128
W8_NUM_REQUESTS = 256  # a rate
W8_START_RATE = 8.0
W8_MAX_RATE = 1024.0
W8_WARMUP_REQUESTS = 32
SATURATION_GROWTH = 1.10  # output tok/s must grow by this much from one rate to the next, or the sweep stops
LATENCIES = ("ttft", "tpot", "itl", "e2e")


def w8_stream_flags(args: Any, vocab_size: int, rates: list[float]) -> list[str]:
    """The flags that make a W8 client process (vLLM's peer, the HTTP client) draw the very requests and arrival
    times this run drew (`add_w8_stream_arguments` reads them)."""
    return ["--rates", ",".join(f"{r:g}" for r in rates), "--num-requests", str(args.num_requests),
            "--prompt-len", str(args.prompt_len), "--output-len", str(args.output_len),
            "--warmup-requests", str(args.warmup_requests), "--seed", str(args.seed), "--vocab-size", str(vocab_size),
            *(["--no-progress"] if args.no_progress else [])]  # fmt: skip


def add_w8_stream_arguments(parser: Any) -> None:
    """A W8 client process's share of `w8_stream_flags` (the vocabulary, seed and progress flags come from the
    process's own parser)."""
    parser.add_argument("--rates", type=arrival_rates, required=True, help="the rates roseinfer ran, in its order")
    for name in ("--num-requests", "--prompt-len", "--output-len", "--warmup-requests"):
        parser.add_argument(name, type=positive_int, required=True)


def build_w8(
    vocab_size: int,
    num_requests: int,
    stream: int,
    *,
    prompt_len: int = W8_PROMPT_LEN,
    output_len: int = W8_OUTPUT_LEN,
    seed: int = 0,
) -> Workload:
    """W8's requests of one stream: random token ids from `default_rng([seed, stream])`."""
    low, high = token_id_range(vocab_size)
    rng = np.random.default_rng([seed, stream])
    prompts = [rng.integers(low, high, size=prompt_len).tolist() for _ in range(num_requests)]
    params = [
        SamplingParams(
            temperature=0.0, max_tokens=output_len, ignore_eos=True, output_kind=RequestOutputKind.DELTA
        )
        for _ in prompts
    ]
    standard = (prompt_len, output_len, num_requests) == (W8_PROMPT_LEN, W8_OUTPUT_LEN, W8_NUM_REQUESTS)
    description = (
        f"{num_requests} requests a rate, {prompt_len} random prompt tokens, {output_len} output tokens"
    )
    return Workload("W8", description, prompts, params, seed, not standard)


@dataclass
class ServeResult:
    rate: float
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    output_tokens: int = 0
    preemptions: int = 0
    kv_usage_max: float = 0.0  # the largest share of KV blocks held after a step
    max_step_s: float = 0.0  # the longest engine step: a stall (a compile, a collection) shows here
    compiles: int = 0  # Triton kernel variants compiled during the run: each is a stall
    # Per running request: its first and latest output's stamps and its tokens so far.
    first: dict[str, float] = field(default_factory=dict, repr=False)
    last: dict[str, float] = field(default_factory=dict, repr=False)
    count: dict[str, int] = field(default_factory=dict, repr=False)

    def on_output(self, rid: str, new: int, finished: bool, now: float, arrival: float) -> bool:
        """Stamps a streamed output of request `rid` that brought `new` tokens and reached the caller at `now`;
        True when it finished the request (its E2E, TPOT and tokens are taken then)."""
        if new:
            if rid not in self.first:
                self.first[rid] = now
                self.ttft.append(now - arrival)
            else:
                self.itl += [(now - self.last[rid]) / new] * new
            self.last[rid] = now
            self.count[rid] = self.count.get(rid, 0) + new
        if not finished:
            return False
        count = self.count.pop(rid, 0)
        first, last = self.first.pop(rid, now), self.last.pop(rid, now)
        self.e2e.append(last - arrival)
        if count > 1:
            self.tpot.append((last - first) / (count - 1))
        self.output_tokens += count
        return True

    def row(self) -> dict[str, Any]:
        wall = self.wall_s if self.wall_s > 0 else float("nan")
        row: dict[str, Any] = {
            "rate": self.rate,
            "requests": len(self.e2e),
            "achieved_req_s": len(self.e2e) / wall,
            "output_tok_s": self.output_tokens / wall,
            "preemptions": self.preemptions,
            "kv_usage_max": self.kv_usage_max,
            "max_step_ms": self.max_step_s * 1e3,
            "compiles": self.compiles,
        }
        for name in LATENCIES:
            values = getattr(self, name)
            row[f"{name}_mean_ms"] = statistics.fmean(values) * 1e3 if values else float("nan")
            for q in (50, 95, 99):
                row[f"{name}_p{q}_ms"] = percentile(values, q) * 1e3
        return row


COLUMNS = [
    ("rate", "rate req/s", "g"),
    ("achieved_req_s", "done req/s", ".2f"),
    ("output_tok_s", "out tok/s", ".0f"),
    *(
        (f"{name}_{stat}_ms", f"{name.upper()} {stat} ms", ".1f")
        for name in ("ttft", "tpot")
        for stat in ("mean", "p50", "p99")
    ),
    ("itl_p50_ms", "ITL p50 ms", ".1f"),
    ("itl_p95_ms", "ITL p95 ms", ".1f"),
    ("itl_p99_ms", "ITL p99 ms", ".1f"),
    ("e2e_p99_ms", "E2E p99 ms", ".0f"),
    ("kv_usage_max", "KV max", ".0%"),
    ("preemptions", "preempted", "d"),
    ("max_step_ms", "max step ms", ".0f"),
    ("compiles", "compiles", "d"),
]
# What only roseinfer's engine reports: a peer's rows leave them empty.
ENGINE_SIDE = ("kv_usage_max", "preemptions", "max_step_ms", "compiles")
PEER_COLUMNS = [c for c in COLUMNS if c[0] not in ENGINE_SIDE]
