"""`roseinfer bench decode`: a full batch's decode step as each engine's own generate loop runs it, against the
hardware floor, and beside vLLM with `--peer vllm`.

    roseinfer bench decode --model-shape qwen2.5-0.5b --batches 1,64 --contexts 1024 --peer vllm

`bench roofline` times roseinfer's step from inside (its graph replayed); no such hook exists in another engine,
so here both engines are timed from outside, the same way. `batch` prompts run to `--short` and to `--long`
output tokens (greedy, ignore_eos, no prefix caching), and the difference of the two wall times over
`long - short` is one step of the whole batch: host, scheduling, sampling and output handling included, as the
engine's loop runs them. The prefill, the ramp up (earlier prompts decode while later ones prefill) and the ramp
down are the same in both runs and cancel, provided `--short` exceeds the prefill's steps. The prompts hold
`context - (short + long) / 2` tokens, so the window's steps attend over `context` tokens on average (a step's KV
read grows linearly with it). Each length runs `--repeats` times, alternating, after one warm-up run; medians.

The floor of a step is `bench roofline`'s: (weight bytes + the batch's KV bytes at `context`) / the copy bandwidth
measured in the same run (GPU only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from roseinfer.bench.engine_run import add_engine_arguments, add_model_arguments, chosen_model, engine_options
from roseinfer.bench.env import bench_header, format_header, measure_copy_bandwidth, write_json_report
from roseinfer.bench.plots import plot_decode, report_plot_path
from roseinfer.bench.prefix_common import format_table
from roseinfer.bench.roofline import decode_floor_bytes
from roseinfer.bench.vllm_peer import add_peer_option, limit_flags, peer_failed, run_peer
from roseinfer.entrypoints.arg_types import positive_int
from roseinfer.entrypoints.llm import LLM
from roseinfer.runner.gc_heap import release_dead_engines
from roseinfer.sampling_params import SamplingParams

# Runs `prompts` to exactly `max_tokens` output tokens each and returns when every one has finished.
Generate = Callable[[list[list[int]], int], None]


@dataclass(frozen=True)
class Window:
    """The two output lengths whose runs are subtracted."""

    short: int
    long: int

    def __post_init__(self) -> None:
        if not 1 <= self.short < self.long:
            raise ValueError(f"need 1 <= short < long, got short={self.short}, long={self.long}")

    @property
    def steps(self) -> int:
        return self.long - self.short

    def prompt_len(self, context: int) -> int:
        """The prompt length whose window steps attend over `context` tokens on average."""
        n = context - (self.short + self.long) // 2
        if n < 1:
            raise ValueError(
                f"context {context} leaves no prompt under a window of {self.short}..{self.long} output tokens"
            )
        return n


def check_cells(
    batches: Sequence[int],
    contexts: Sequence[int],
    window: Window,
    token_budget: int,
    chunked: bool,
    num_blocks: int,
    block_size: int,
) -> None:
    """Refuses cells the window cannot time: a prefill longer (in steps) than the short run, whose ramp would then
    differ between the two runs, or a batch whose KV does not fit the cache at once (preemption would be timed)."""
    for context in contexts:
        prompt_len = window.prompt_len(context)
        for batch in batches:
            # unchunked, a step prefills whole prompts only
            per_step = token_budget if chunked else max(1, token_budget // prompt_len) * prompt_len
            prefill_steps = -(-batch * prompt_len // per_step)
            if window.short <= prefill_steps:
                raise ValueError(
                    f"batch {batch} at context {context}: its prefill takes {prefill_steps} steps of "
                    f"{token_budget} tokens, not fewer than --short {window.short}; raise --short (and --long)"
                )
            need = batch * -(-(prompt_len + window.long) // block_size)
            if need > num_blocks:
                raise ValueError(
                    f"batch {batch} at context {context} needs {need} KV blocks at once, the cache has {num_blocks}"
                )


def window_prompts(vocab_size: int, batch: int, prompt_len: int, seed: int) -> list[list[int]]:
    """`batch` random prompts, token ids uniform in [1000, min(vocab, 32000)) as WORKLOADS.md draws them."""
    rng = np.random.default_rng(seed)
    high = min(vocab_size, 32000)
    low = 1000 if high > 1000 else 0
    return rng.integers(low, high, size=(batch, prompt_len)).tolist()


def time_window(
    generate: Generate,
    prompts: list[list[int]],
    window: Window,
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """The window's runs, alternating short and long after one long warm-up, and the step time they give."""
    generate(prompts, window.long)  # compiles, graph captures and allocator growth stay out of the timing
    times: dict[int, list[float]] = {window.short: [], window.long: []}
    for _ in range(repeats):
        for n in (window.short, window.long):
            t0 = clock()
            generate(prompts, n)
            times[n].append(clock() - t0)
    short_s = statistics.median(times[window.short])
    long_s = statistics.median(times[window.long])
    return {
        "short_s": short_s,
        "long_s": long_s,
        "long_spread_s": max(times[window.long]) - min(times[window.long]),
        "step_ms": (long_s - short_s) / window.steps * 1e3,
    }


def measure_steps(
    generate: Generate,
    vocab_size: int,
    batches: Sequence[int],
    contexts: Sequence[int],
    window: Window,
    repeats: int,
    seed: int,
    desc: str,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """A row per (context, batch): its prompt length, the two runs' medians and the step time."""
    cells = [(c, b) for c in contexts for b in batches]
    rows = []
    for context, batch in tqdm(cells, desc=desc, unit="row", disable=not progress):
        prompt_len = window.prompt_len(context)
        prompts = window_prompts(vocab_size, batch, prompt_len, seed)
        row = {"batch": batch, "context": context, "prompt_len": prompt_len}
        rows.append(row | time_window(generate, prompts, window, repeats))
    return rows


def greedy_params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def check_lengths(lengths: Sequence[int], max_tokens: int, engine: str) -> None:
    """A run that stopped any prompt short of `max_tokens` would time fewer steps than it claims."""
    wrong = [n for n in lengths if n != max_tokens]
    if wrong:
        raise RuntimeError(f"{engine}: {len(wrong)} outputs of {wrong[0]} tokens, asked for {max_tokens}")


def roseinfer_generate(llm: LLM) -> Generate:
    def generate(prompts: list[list[int]], max_tokens: int) -> None:
        outs = llm.generate(prompts, greedy_params(max_tokens), use_tqdm=False)
        check_lengths([len(o.outputs[0].token_ids) for o in outs], max_tokens, "roseinfer")

    return generate


COLUMNS = [
    ("batch", "batch", "d"),
    ("context", "ctx", "d"),
    ("floor_ms", "floor ms", ".3f"),
    ("step_ms", "roseinfer ms", ".3f"),
    ("x_floor", "x floor", ".2f"),
    ("peer_step_ms", "vLLM ms", ".3f"),
    ("peer_x_floor", "x floor", ".2f"),
    ("peer_over_ours", "vLLM / roseinfer", ".2f"),
]


def add_floors(rows: list[dict[str, Any]], floor_s: Callable[[int, int], float] | None) -> None:
    for row in rows:
        if floor_s is not None:
            row["floor_ms"] = floor_s(row["batch"], row["context"]) * 1e3
            row["x_floor"] = row["step_ms"] / row["floor_ms"]


def join_peer(rows: list[dict[str, Any]], peer_rows: list[dict[str, Any]]) -> None:
    """The peer's step time (and its multiple of the same floor) into roseinfer's row for the same cell."""
    theirs = {(r["batch"], r["context"]): r for r in peer_rows}
    for row in rows:
        peer = theirs.get((row["batch"], row["context"]))
        if peer is None:
            continue
        row["peer_step_ms"] = peer["step_ms"]
        row["peer_over_ours"] = peer["step_ms"] / row["step_ms"] if row["step_ms"] > 0 else None
        if "floor_ms" in row:
            row["peer_x_floor"] = peer["step_ms"] / row["floor_ms"]


def int_list(text: str) -> list[int]:
    values = [positive_int(x) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of positive ints, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--batches", type=int_list, default=[1, 16, 64], help="decode batch sizes")
    parser.add_argument("--contexts", type=int_list, default=[1024], help="mean context of the timed steps")
    parser.add_argument("--short", type=positive_int, default=32, help="output tokens of the shorter run")
    parser.add_argument("--long", type=positive_int, default=160, help="output tokens of the longer run")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs of each length (medians)")
    parser.add_argument("--seed", type=int, default=0, help="prompts seed")
    parser.add_argument("--json", default=None, metavar="PATH", help="write every number here")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    add_peer_option(parser, "the same cells (its LLM.generate, timed the same way)")
    add_engine_arguments(parser, prefix_caching_flag=False)


def peer_command(args: argparse.Namespace, model: str, vocab_size: int, config: Any, path: str) -> list[str]:
    """The `decode_steps_vllm` command for the cells roseinfer ran, under the limits its engine ran with."""
    cmd = [sys.executable, "-m", "roseinfer.bench.decode_steps_vllm", "--model", model]
    cmd += ["--batches", ",".join(map(str, args.batches)), "--contexts", ",".join(map(str, args.contexts))]
    cmd += ["--short", str(args.short), "--long", str(args.long), "--repeats", str(args.repeats)]
    cmd += ["--vocab-size", str(vocab_size), *limit_flags(config), "--seed", str(args.seed), "--json", path]
    return cmd + (["--no-progress"] if args.no_progress else [])


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The engine the cells need: dummy weights, no prefix caching (the repeats would hit it), room for the
    largest batch, and a CPU pool that holds it."""
    kw: dict[str, Any] = {"load_format": "dummy", "dtype": args.dtype, "enable_prefix_caching": False}
    kw["max_num_seqs"] = max(args.batches)
    kw.update(engine_options(args))
    block = kw.get("block_size", 16)
    kw["cpu_kv_tokens"] = max(args.batches) * (max(args.contexts) + args.long + 2 * block)
    return kw


def run_decode(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the command; prints the report and returns every number (also written to --json)."""
    window = Window(args.short, args.long)
    for context in args.contexts:
        window.prompt_len(context)  # a bad window fails before any engine is built
    model, shape = chosen_model(args)
    llm = LLM(model, **engine_kwargs(args))
    config = llm.engine.config
    cfg = config.model_config
    header = bench_header(
        "decode-steps",
        shape,
        command=getattr(args, "argv", None),
        device=config.device,
        dtype=str(config.dtype).removeprefix("torch."),
        window=f"{window.short}..{window.long} output tokens ({window.steps} steps a row), {args.repeats} repeats",
        compare="the hardware floor (weights + KV bytes over copy bandwidth); vLLM's generate with --peer vllm",
    )
    print(format_header(header), flush=True)
    print(llm.engine.core.startup.line(), flush=True)
    sched, core = config.scheduler, llm.engine.core
    check_cells(
        args.batches,
        args.contexts,
        window,
        sched.max_num_batched_tokens,
        sched.enable_chunked_prefill,
        core.num_blocks,
        config.cache.block_size,
    )
    floor_s = None
    report: dict[str, Any] = {"header": header, "startup": llm.engine.core.startup.to_dict()}
    if config.device.type == "cuda":
        bandwidth = measure_copy_bandwidth(config.device)
        report["bandwidth_bytes_per_s"] = bandwidth
        elem = torch.empty((), dtype=config.dtype).element_size()
        kv_dtype = llm.engine.core.runner.kv_dtype

        def floor_s(batch: int, context: int) -> float:
            return decode_floor_bytes(cfg, elem, kv_dtype, batch, context) / bandwidth

    rows = measure_steps(
        roseinfer_generate(llm),
        cfg.vocab_size,
        args.batches,
        args.contexts,
        window,
        args.repeats,
        args.seed,
        "roseinfer decode steps",
        not args.no_progress,
    )
    add_floors(rows, floor_s)
    report["rows"] = rows
    if args.peer == "vllm":
        del llm  # vLLM sizes its cache by the memory free when it starts
        release_dead_engines(config.device)
        report["peer"] = run_peer(lambda path: peer_command(args, model, cfg.vocab_size, config, path))
        if "error" in report["peer"]:
            print(report["peer"]["error"], flush=True)
        else:
            join_peer(rows, report["peer"]["rows"])
    title = f"decode step, steady, as each engine's generate loop runs it ({window.steps}-step window)"
    print(format_table(title, COLUMNS, rows), flush=True)
    if args.json:
        made = plot_decode(report, report_plot_path(args.json, "decode"))
        report["plots"] = {"decode": made} if made else {}
        if made:
            print(f"plot: {made}", flush=True)
        write_json_report(args.json, report)
    return report


def run(args: argparse.Namespace) -> int:
    return 1 if peer_failed(run_decode(args)) else 0
