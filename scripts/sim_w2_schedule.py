"""A cost model of an offline run's schedule: what admission order and token budget would give, before
building them. llama-3.1-8b on the H100 by default.

Each step costs GEMMs(rows) + decode KV read + prefill attention, and a step with prefill in it at
least `--host-mixed-ms` (mixed steps run eagerly: their host launch time can exceed the GPU's).
GEMMs(rows) blends the weight-read time (`--gemm-floor-ms`) and the compute time (`--us-per-row`)
with a p-norm (`--ridge-p`: higher is a sharper ridge). Calibration, H100, twelfth session: W2 fcfs at
16k predicts 8,689 out tok/s against 8,533 measured; a lof-320 mixed step's kernels 14.7 / 20.2 ms at
129 / 223 decodes against ~14 / ~21 predicted.

    python scripts/sim_w2_schedule.py [--host-mixed-ms 30] [--budgets 320,512,16384]
"""

from __future__ import annotations

import argparse

from roseinfer.bench.workloads import build_workload


def simulate(prompts, outputs, order, budget, max_seqs, cost) -> tuple[float, int, int]:
    """Continuous batching, decode-first, chunked prefill: returns (seconds, steps, mixed steps)."""
    waiting, prefilling, decoding = list(order), {}, {}  # request -> prompt tokens done / tokens out
    seconds, steps, mixed, done = 0.0, 0, 0, 0
    while done < len(prompts):
        rows = len(decoding)
        context = sum(prompts[r] + n for r, n in decoding.items())
        while waiting and len(prefilling) + len(decoding) < max_seqs:
            prefilling[waiting.pop(0)] = 0
        left, chunk_tokens, attn, finished = budget - rows, 0, 0.0, []
        for r in list(prefilling):
            if left <= 0:
                break
            c = min(prompts[r] - prefilling[r], left)
            attn += cost.prefill_attention(c, prefilling[r])
            prefilling[r] += c
            left -= c
            chunk_tokens += c
            if prefilling[r] == prompts[r]:
                finished.append(r)
        step = cost.gemms(rows + chunk_tokens) + context * cost.kv_s_per_token + attn + cost.fixed_s
        if chunk_tokens:
            step = max(step, cost.host_mixed_s)
            mixed += 1
        seconds += step
        steps += 1
        for r in list(decoding):
            decoding[r] += 1
            if decoding[r] >= outputs[r]:
                del decoding[r]
                done += 1
        for r in finished:
            del prefilling[r]
            if outputs[r] <= 1:
                done += 1
            else:
                decoding[r] = 1
    return seconds, steps, mixed


class Cost:
    def __init__(self, args: argparse.Namespace) -> None:
        kv_bytes_per_token = 2 * args.layers * args.kv_heads * args.head_dim * 2  # K and V, bf16
        self.kv_s_per_token = kv_bytes_per_token / (args.bandwidth_tbps * 1e12 * args.attention_efficiency)
        self.gemm_floor_s = args.gemm_floor_ms * 1e-3
        self.s_per_row = args.us_per_row * 1e-6
        self.p = args.ridge_p
        self.attention_flops_per_pair = 4 * args.layers * args.heads * args.head_dim
        self.attention_flops_rate = args.attention_tflops * 1e12
        self.host_mixed_s = args.host_mixed_ms * 1e-3
        self.fixed_s = 1e-4

    def gemms(self, rows: int) -> float:
        return (self.gemm_floor_s**self.p + (self.s_per_row * rows) ** self.p) ** (1 / self.p)

    def prefill_attention(self, chunk: int, prefix: int) -> float:
        return self.attention_flops_per_pair * chunk * (prefix + chunk / 2) / self.attention_flops_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W2")
    parser.add_argument("--vocab-size", type=int, default=128256)
    parser.add_argument("--budgets", default="320,384,512,1024,16384")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--host-mixed-ms", type=float, default=0.0, help="least time of a mixed step")
    parser.add_argument("--gemm-floor-ms", type=float, default=6.3, help="a step's GEMMs at few rows")
    parser.add_argument("--us-per-row", type=float, default=25.0, help="GEMM time a row, compute-bound")
    parser.add_argument("--ridge-p", type=float, default=4.0)
    parser.add_argument("--bandwidth-tbps", type=float, default=2.99)
    parser.add_argument("--attention-efficiency", type=float, default=0.95)
    parser.add_argument("--attention-tflops", type=float, default=300.0)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    workload = build_workload(args.workload, args.vocab_size)
    prompts, outputs = workload.prompt_lens, workload.output_lens
    fcfs = list(range(len(prompts)))
    lof = sorted(fcfs, key=lambda r: -outputs[r])
    cost = Cost(args)
    total_out = sum(outputs)
    print(
        f"{args.workload}: {len(prompts)} requests, {total_out} output tokens, host floor of a mixed step "
        f"{args.host_mixed_ms} ms"
    )
    print(f"{'order':6s}{'budget':>8s}{'seconds':>9s}{'steps':>7s}{'mixed':>7s}{'out tok/s':>11s}")
    for name, order in (("fcfs", fcfs), ("lof", lof)):
        for budget in map(int, args.budgets.split(",")):
            seconds, steps, mixed = simulate(prompts, outputs, order, budget, args.max_num_seqs, cost)
            print(f"{name:6s}{budget:8d}{seconds:9.2f}{steps:7d}{mixed:7d}{total_out / seconds:11.0f}")


if __name__ == "__main__":
    main()
