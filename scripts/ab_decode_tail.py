"""A decode step's tail (final norm, lm_head, sampler) and head (pending ids) in variants, each captured from
one engine (same weights, same KV cache, same step) several times and replayed alternately. Separate engines,
and separate captures of one graph, differ by up to ~10 us a step at qwen2.5-0.5b's b=64 (where their buffers
land, presumably): as much as these variants do. GPU only.

    python scripts/ab_decode_tail.py --model-shape qwen2.5-0.5b --batches 16,32,64

Variants: `fused` (the engine: the sampler in the lm_head's epilogue, the final norm, lm_head and sampler in the
PDL chain), `fused-no-pdl` (the same kernels launched without PDL), `unfused` (the final norm, then the lm_head on
cuBLAS, then `sample_tokens`), `no-lm-head` (no lm_head and no sampler: the rest of the step, for the tail's cost),
`torch-fill` (the pending ids filled by torch's indexing, four launches, instead of `kernels/pending_ids.py`),
`fill-noops` (the engine's fill, then three launches that do nothing: does the launch count alone move a step?).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import numpy as np
import torch
from ab_pdl_decode import replay_us  # scripts/ is on the path when a script runs

from roseinfer.bench.roofline import decode_step
from roseinfer.entrypoints.llm import LLM
from roseinfer.kernels import logits_sample, rmsnorm
from roseinfer.models import llama
from roseinfer.runner import cuda_graphs
from roseinfer.runner.cuda_graphs import capture_graphs

VARIANTS = ("fused", "fused-no-pdl", "unfused", "no-lm-head", "torch-fill", "fill-noops")


@contextlib.contextmanager
def variant(name: str):
    """The engine's modules patched as `name` runs, for the captures made inside."""
    saved = (llama.LlamaForCausalLM.forward_sample, logits_sample.pdl_kwargs, rmsnorm.pdl_kwargs)
    fill = cuda_graphs.fill_pending
    if name == "fused-no-pdl":
        logits_sample.pdl_kwargs = rmsnorm.pdl_kwargs = lambda pdl: {"PDL": False}
    elif name == "unfused":
        llama.LlamaForCausalLM.forward_sample = lambda *args, **kwargs: None
    elif name == "no-lm-head":

        def hidden_only(self, input_ids, positions, ctx, *args):
            return self.model(input_ids, positions, ctx, deferred_norm=True, chain=self.decode_chain)

        llama.LlamaForCausalLM.forward_sample = hidden_only
    elif name == "torch-fill":

        def torch_fill(ids, fill_index, fill_row, prev):
            ids[fill_index.long()] = prev[fill_row.long()]

        cuda_graphs.fill_pending = torch_fill
    elif name == "fill-noops":
        scratch = torch.zeros(1, device="cuda")

        def fill_then_noops(ids, fill_index, fill_row, prev):
            fill(ids, fill_index, fill_row, prev)
            for _ in range(3):
                scratch.add_(0.0)

        cuda_graphs.fill_pending = fill_then_noops
    try:
        yield
    finally:
        llama.LlamaForCausalLM.forward_sample, logits_sample.pdl_kwargs, rmsnorm.pdl_kwargs = saved
        cuda_graphs.fill_pending = fill


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-shape", default="qwen2.5-0.5b")
    p.add_argument("--batches", default="16,32,64")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--captures", type=int, default=3)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--temperature", type=float, default=0.0, help="every row's (0: greedy)")
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    names = args.variants.split(",")
    if not set(names) <= set(VARIANTS):
        p.error(f"--variants takes {', '.join(VARIANTS)}")
    llm = LLM(
        args.model_shape,
        load_format="dummy",
        dtype="bfloat16",
        block_size=16,
        num_kv_blocks=max(batches) * (-(-args.context // 16) + 1) + 16,
        max_num_seqs=max(batches),
        max_num_batched_tokens=2048,
        max_model_len=args.context + 16,
        mixed_graph_max_tokens=0,
        enable_prefix_caching=False,
    )
    runner = llm.engine.core.runner
    graphs = runner.graphs
    assert graphs is not None and runner.model.pdl_decode, "needs the PDL decode chain (an sm_90+ GPU)"
    print(
        f"{args.model_shape}, ctx {args.context}, T {args.temperature}, us a step (graph replays back to back), "
        f"one engine, {args.captures} captures a variant (interleaved), median of {args.rounds} alternating rounds "
        "each; the step is the median over the captures, then each capture's median"
    )
    for batch in batches:
        step = decode_step(batch, args.context, 16, runner.cfg.vocab_size, np.random.default_rng(batch))
        assert graphs.can_run(step)
        temperature = np.full(batch, args.temperature, np.float32) if args.temperature > 0 else None
        graphs.run(step, None, temperature)  # stages the step's inputs into the graphs' buffers
        captured: list[tuple[str, torch.cuda.CUDAGraph]] = []
        for _ in range(args.captures):  # each capture places its buffers anew: that alone moves a step
            for name in names:
                with variant(name):
                    graph = capture_graphs([batch], graphs._meta, graphs.body, runner.device)[batch][0]
                captured.append((name, graph))
        times: list[list[float]] = [[] for _ in captured]
        for _ in range(args.rounds):
            for i, (_, graph) in enumerate(captured):
                times[i].append(replay_us(graph, args.iters))
        per_capture = {
            name: [statistics.median(t) for (n, _), t in zip(captured, times) if n == name] for name in names
        }
        base = statistics.median(per_capture[names[0]])
        for name in names:
            us = statistics.median(per_capture[name])
            each = " ".join(f"{t:.1f}" for t in per_capture[name])
            print(f"{batch:5d} {name:>13} {us:9.1f} {us - base:+7.1f}   {each}")


if __name__ == "__main__":
    main()
