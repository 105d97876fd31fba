"""Follow-up turns over cached histories, with and without the mixed-step graphs' LONG_TILE twins, in one engine.

Each of `--conversations` histories of `--history` tokens is prefilled once (into the prefix cache); then every
round sends each conversation a follow-up of `--follow-up` new tokens (fresh ids each round, so each round's
chunks run over the cached history only), one output token, under a `--budget`-token step: steps of
`budget / follow_up` chunks over long prefixes, which replay the twins (`MixedGraphs.long_graphs`). Rounds
alternate twins on and off (off: the twins are set aside, so those steps replay the 64-row graphs, or run eagerly
where LONG_TILE's own rule takes them: chunks of 768 tokens or more), and the table
gives each side's rounds, prefill tokens/s and the steps that took LONG_TILE.

With `--eager` every step runs eagerly (no mixed-step graphs), and the rounds alternate the graphs' rule on and off
in the eager steps' tile maps (`TilePlanner.eager_map`; off: the plain 64-row grid).

    python scripts/ab_long_tile_graphs.py --model-shape llama-3.1-8b --rounds 5
    python scripts/ab_long_tile_graphs.py --model-shape llama-3.1-8b --eager --budget 4096
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from roseinfer import SamplingParams
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.llm import make_engine_config

CONFIGS = Path(__file__).resolve().parents[1] / "roseinfer/models/configs"


def run_all(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for prompt in prompts:
        engine.add_request(prompt, params)
    while engine.has_unfinished_requests():
        engine.step(final_only=True)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-shape", default="llama-3.1-8b")
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--history", type=int, default=4096)
    parser.add_argument("--follow-up", type=int, default=512)
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5, help="rounds a side, alternating")
    parser.add_argument(
        "--eager", action="store_true", help="eager steps: the graphs' rule in their tile maps"
    )
    args = parser.parse_args()
    config, path = make_engine_config(
        str(CONFIGS / f"{args.model_shape}.json"),
        load_format="dummy",
        dtype="bfloat16",
        device="cuda",
        max_num_batched_tokens=args.budget,
        max_model_len=args.history + args.follow_up * (2 * args.rounds + 1) + 16,
        mixed_graph_max_tokens=0 if args.eager else None,
    )
    engine = LLMEngine(config, path)
    runner = engine.core.runner
    mixed, planner = runner.mixed_graphs, runner.tile_planner
    if args.eager:
        ready = planner is not None and planner.ws_long
    else:
        ready = mixed is not None and bool(mixed.long_graphs)
    if not ready:
        raise SystemExit(
            "no LONG_TILE uncut maps on this device and model (they need the warp-specialised kernel)"
        )
    twins = mixed.long_graphs if mixed is not None else {}
    side = "rule" if args.eager else "twins"  # rule: the graphs' rule in the eager steps' maps

    def set_side(on: bool) -> None:
        if args.eager:
            planner.ws_long = on
        else:
            mixed.long_graphs = twins if on else {}

    rng = np.random.default_rng(0)
    vocab = min(engine.model_config.vocab_size, 32000)
    histories = [rng.integers(1000, vocab, args.history).tolist() for _ in range(args.conversations)]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    run_all(engine, histories, one)
    times: dict[bool, list[float]] = {True: [], False: []}
    long_steps: dict[bool, int] = {True: 0, False: 0}
    for r in range(2 * args.rounds + 1):  # round 0 (twins on) warms up and is not counted
        on = r % 2 == 0
        set_side(on)
        prompts = [h + rng.integers(1000, vocab, args.follow_up).tolist() for h in histories]
        before = runner.step_paths["long_tile"]
        seconds = run_all(engine, prompts, one)
        if r:
            times[on].append(seconds)
            long_steps[on] += runner.step_paths["long_tile"] - before
    set_side(True)
    tokens = args.conversations * args.follow_up
    print(f"{args.model_shape} on {torch.cuda.get_device_name()}: {args.conversations} follow-ups of "
          f"{args.follow_up} tokens over {args.history} cached, budget {args.budget}"
          f"{', eager steps' if args.eager else ''}")  # fmt: skip
    print(f"{side:6s}{'rounds (s)':>40s}{'median s':>10s}{'prefill tok/s':>15s}{'LONG_TILE steps':>17s}")
    for on in (False, True):
        med = statistics.median(times[on])
        rounds = " ".join(f"{t:.3f}" for t in times[on])
        print(f"{'on' if on else 'off':6s}{rounds:>40s}{med:10.3f}{tokens / med:15.0f}{long_steps[on]:17d}")
    print(f"{side} on / off (median): {statistics.median(times[True]) / statistics.median(times[False]):.3f}")


if __name__ == "__main__":
    main()
