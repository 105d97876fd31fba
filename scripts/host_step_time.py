"""The host's share of each engine step at W2's (or W1's) batch, with the model stubbed out (runs on a CPU).

A qwen2.5-0.5b-shaped config with one tiny layer is built with dummy weights; its forward returns zeros
and its logits are 16 wide, so the time left is the scheduler, input building, sampling settings and
output handling: what bounds a small model's steps when the GPU is fast. Prints ms per step; with
--profile, the cProfile entries by cumulative time.

    python scripts/host_step_time.py --max-output-len 400 [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from roseinfer.bench.workloads import build_workload
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.llm import make_engine_config

CONFIG = Path(__file__).resolve().parents[1] / "roseinfer/models/configs/qwen2.5-0.5b.json"
VOCAB = 32000


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W2", help="W1 or W2")
    parser.add_argument("--max-output-len", type=int, default=400)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="cumulative", help="cProfile sort key, e.g. tottime")
    args = parser.parse_args()
    cfg = json.loads(CONFIG.read_text())
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
        )
        engine = LLMEngine(config, path)
    engine.core.runner.model = StubModel(engine.core.runner.model)
    workload = build_workload(args.workload, VOCAB, max_output_len=args.max_output_len)
    for prompt, params in zip(workload.prompts, workload.params):
        engine.add_request(prompt, params)
    steps = 0

    def run() -> None:
        nonlocal steps
        while engine.has_unfinished_requests():
            engine.step(final_only=True)
            steps += 1

    profiler = cProfile.Profile() if args.profile else None
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.runcall(run)
    else:
        run()
    seconds = time.perf_counter() - t0
    if profiler is not None:
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(40)
    print(
        f"{args.workload} (outputs <= {args.max_output_len}): {steps} steps, {seconds / steps * 1e3:.3f} ms of host per step"
    )


if __name__ == "__main__":
    main()
