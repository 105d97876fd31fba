"""The roofline floor of a throughput run (the least time the device's measured limits allow) and its
report lines."""

from __future__ import annotations

import math

import torch

from roseinfer.bench.run_result import RunResult
from roseinfer.bench.workloads import Workload
from roseinfer.config import ModelConfig


def distinct_prompt_tokens(prompts: list[list[int]]) -> int:
    """Nodes of the prompts' token trie: the prompt tokens any prefix cache must still compute."""
    root: dict = {}
    count = 0
    for prompt in prompts:
        node = root
        for t in prompt:
            nxt = node.get(t)
            if nxt is None:
                nxt = node[t] = {}
                count += 1
            node = nxt
    return count


def roofline_floor(
    model_config: ModelConfig,
    dtype: torch.dtype,
    workload: Workload,
    max_num_seqs: int,
    bandwidth: float,
    tflops: float,
    kv_dtype: torch.dtype | None = None,
    prefix_caching: bool = False,
) -> dict[str, float]:
    """Lower bound of the run's time on this device.

    Prefill: 2 x matmul params x prompt tokens (the LM head only at each request's last prompt token)
    at the measured matmul rate; with `prefix_caching`, each distinct prompt prefix token counts once (the
    least any prefix cache must compute). Decode: every decode step reads all weights once, and each generated
    token reads its context's KV once, at the measured copy bandwidth. Steps: at least the longest
    output, and at least the decode tokens over the batch limit. KV bytes are of `kv_dtype` (default: `dtype`).
    """
    c = model_config
    elem = torch.empty((), dtype=dtype).element_size()
    embed = c.vocab_size * c.hidden_size
    layer_params = c.num_layers * c.layer_params()
    prompt_tokens = distinct_prompt_tokens(workload.prompts) if prefix_caching else workload.num_prompt_tokens
    prefill_flops = 2 * layer_params * prompt_tokens + 2 * embed * workload.num_requests
    decode_tokens = [max(0, n - 1) for n in workload.output_lens]  # the first token comes from prefill
    steps = max(max(decode_tokens), math.ceil(sum(decode_tokens) / max_num_seqs))
    weight_bytes = (layer_params + embed) * elem
    kv_bytes = c.kv_bytes_per_token(kv_dtype or dtype) * sum(
        d * (p + 1 + (d - 1) / 2) for p, d in zip(workload.prompt_lens, decode_tokens)
    )
    prefill_s = prefill_flops / (tflops * 1e12)
    decode_s = (steps * weight_bytes + kv_bytes) / bandwidth
    return {
        "bandwidth_bytes_per_s": bandwidth,
        "matmul_tflops": tflops,
        "prefill_flops": float(prefill_flops),
        "decode_steps": float(steps),
        "decode_weight_bytes": float(steps * weight_bytes),
        "decode_kv_bytes": float(kv_bytes),
        "prefill_floor_s": prefill_s,
        "decode_floor_s": decode_s,
        "floor_s": prefill_s + decode_s,
    }


def format_roofline(floor: dict[str, float], results: list[RunResult]) -> str:
    lines = [
        "=== roofline floor ===",
        f"Copy bandwidth (read+write): {floor['bandwidth_bytes_per_s'] / 1e12:.3f} TB/s",
        f"Matmul rate: {floor['matmul_tflops']:.1f} TFLOP/s",
        f"Prefill floor: {floor['prefill_floor_s']:.6f} seconds",
        f"Decode floor: {floor['decode_floor_s']:.6f} seconds "
        f"({floor['decode_steps']:.0f} steps, {floor['decode_weight_bytes'] / 1e9:.2f} GB weights, "
        f"{floor['decode_kv_bytes'] / 1e9:.2f} GB KV)",
        f"Floor (total): {floor['floor_s']:.6f} seconds",
    ]
    lines += [f"{r.name}: {r.total_time / floor['floor_s']:.2f}x floor" for r in results]
    return "\n".join(lines)
