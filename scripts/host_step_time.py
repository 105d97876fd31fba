"""The host's share of each engine step at W2's (or W1's) batch, split by phase.

On the CPU (default) a qwen2.5-0.5b-shaped config with one tiny layer is built with dummy weights; its
forward returns zeros and its logits are 16 wide, so the time left is the scheduler, input building,
sampling settings and output handling: what bounds a small model's steps when the GPU is fast.
With `--device cuda` the real qwen2.5-0.5b runs (bf16, CUDA graphs): the phases are then the host's
side of a GPU step, graph replay and sampler launches included, after one warm-up pass.

Prints ms per step; `--phases`, host ms per step of each phase (perf_counter around the calls, no
profiler); `--profile`, the cProfile entries (sorted by `--sort`).

    python scripts/host_step_time.py --workload W1 --phases [--device cuda]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import json
import pstats
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch import nn

import roseinfer.runner.model_runner as model_runner
import roseinfer.runner.step_future as step_future
from roseinfer.attention.triton_backend import TritonAttentionBackend
from roseinfer.bench.device import sync
from roseinfer.bench.workloads import build_workload
from roseinfer.engine.core import EngineCore
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.llm import make_engine_config
from roseinfer.models.llama import LlamaForCausalLM
from roseinfer.runner.cuda_graphs import DecodeGraphs
from roseinfer.scheduler.scheduler import Scheduler

CONFIGS = Path(__file__).resolve().parents[1] / "roseinfer/models/configs"
VOCAB = 32000

# (owner, attribute, phase): the calls timed by --phases. Nested phases are reported as they are
# (launch includes build_host_step, graph_run and sample).
PHASES = [
    (LLMEngine, "step", "step (all)"),
    (Scheduler, "schedule", "schedule"),
    (model_runner.ModelRunner, "launch", "launch"),
    (model_runner, "build_host_step", "  build_host_step"),
    (DecodeGraphs, "run", "  graph inputs + replay"),
    (LlamaForCausalLM, "forward", "  eager forward (launches)"),
    (TritonAttentionBackend, "forward", "    attention (launches)"),
    (model_runner, "sample", "  sample"),
    (step_future.StepFuture, "result", "wait for the device"),
    (Scheduler, "update_from_output", "update"),
]


class StubModel(nn.Module):
    """Zeros for hidden states and 16-wide logits; everything else is the real model's."""

    def __init__(self, real: nn.Module) -> None:
        super().__init__()
        self.real = real

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, ctx: object) -> torch.Tensor:
        return torch.zeros(ids.shape[0], 8)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden.shape[0], 16)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.real, name)


@contextmanager
def timed_phases(totals: collections.Counter[str]) -> Iterator[None]:
    """Wraps each PHASES call to add its wall time to `totals` while the block runs."""
    saved = []
    for owner, name, phase in PHASES:
        original = getattr(owner, name)
        saved.append((owner, name, original))
        setattr(owner, name, _timer(original, phase, totals))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def _timer(fn: Callable, phase: str, totals: collections.Counter[str]) -> Callable:
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[phase] += time.perf_counter() - t0

    return timed


def build_engine(args: argparse.Namespace) -> LLMEngine:
    config_file = CONFIGS / f"{args.model_shape}.json"
    if args.device == "cuda":
        config, path = make_engine_config(
            str(config_file),
            load_format="dummy",
            dtype="bfloat16",
            device="cuda",
            max_num_batched_tokens=args.max_num_batched_tokens,
            admission_policy=args.admission_policy,
        )
        return LLMEngine(config, path)
    cfg = json.loads(config_file.read_text())
    cfg.update(num_hidden_layers=1, vocab_size=VOCAB, hidden_size=64, intermediate_size=128)
    cfg.update(num_attention_heads=2, num_key_value_heads=1)
    with tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(cfg))
        config, path = make_engine_config(
            model_dir,
            load_format="dummy",
            dtype="float32",
            device="cpu",
            max_num_seqs=256,
            cpu_kv_tokens=400_000,
            max_num_batched_tokens=args.max_num_batched_tokens,
            admission_policy=args.admission_policy,
        )
        engine = LLMEngine(config, path)
    engine.core.runner.model = StubModel(engine.core.runner.model)
    return engine


def run_workload(engine: LLMEngine, name: str, max_output_len: int, seed: int) -> int:
    """Adds the workload's requests and steps until they finish; returns the steps taken."""
    vocab = engine.model_config.vocab_size
    workload = build_workload(name, min(vocab, VOCAB), max_output_len=max_output_len, seed=seed)
    for prompt, params in zip(workload.prompts, workload.params):
        engine.add_request(prompt, params)
    steps = 0
    while engine.has_unfinished_requests():
        engine.step(final_only=True)
        steps += 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W2", help="W1 or W2")
    parser.add_argument("--max-output-len", type=int, default=400)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model-shape", default="qwen2.5-0.5b", help="cuda: the shape that runs")
    parser.add_argument("--admission-policy", default="fcfs")
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--phases", action="store_true", help="host ms per step of each phase")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="cumulative", help="cProfile sort key, e.g. tottime")
    parser.add_argument(
        "--gc", choices=["on", "freeze", "off"], default="on", help="Python's GC during the run"
    )
    args = parser.parse_args()
    engine = build_engine(args)
    if args.device == "cuda":  # compiles, cuBLAS heuristics and allocator growth stay out of the timing
        run_workload(engine, args.workload, args.max_output_len, seed=1)
    core: EngineCore = engine.core
    core.stats.reset()
    if args.gc != "on":
        gc.collect()
        gc.freeze() if args.gc == "freeze" else gc.disable()
    totals: collections.Counter[str] = collections.Counter()
    profiler = cProfile.Profile() if args.profile else None
    sync(engine.config.device)
    with timed_phases(totals) if args.phases else nullcontext():
        t0 = time.perf_counter()
        if profiler is not None:
            steps = profiler.runcall(run_workload, engine, args.workload, args.max_output_len, 0)
        else:
            steps = run_workload(engine, args.workload, args.max_output_len, 0)
        sync(engine.config.device)
        seconds = time.perf_counter() - t0
    if profiler is not None:
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(40)
    if args.phases:
        print(f"{'phase':28s} {'ms/step':>8s}")
        for _, _, phase in PHASES:
            print(f"{phase:28s} {totals[phase] / steps * 1e3:8.3f}")
    print(
        f"{args.workload} (outputs <= {args.max_output_len}, {args.device}): {steps} steps, "
        f"{seconds / steps * 1e3:.3f} ms of host per step, host blocked on the device "
        f"{core.stats.device_wait_time / seconds:.0%} of the run"
    )


if __name__ == "__main__":
    main()
