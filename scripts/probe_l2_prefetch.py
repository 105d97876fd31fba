"""Would warming L2 with the next weights shorten a small model's decode step? (GPU only.)

A qwen2.5-0.5b decode step at batch 64 is ~2.4x its byte floor: its GEMMs are latency-bound (a 2 MB weight
takes ~4.5 us), so HBM idles for much of the step. H100's L2 is 50 MB and one qwen layer's weights are
30 MB. If a side stream pulls layer i+1's weights into L2 while layer i runs, the GEMMs would read L2.

- `gemm`: each decode GEMM of qwen2.5-0.5b at batch 64, in a graph of 24 launches over 24 distinct weights
  (cold: every weight from HBM, as in a step) against 24 launches over one weight (hot: from L2), and
  with each weight prefetched on a side stream one launch ahead.
- `step --prefetch MODE --lead L`: `bench roofline`'s graphed decode step with the deferred-norm layer
  loop patched to prefetch on a side stream (MODE none, bulk, line; L 1 = the next layer's weights at
  the start of a layer, 0 = this layer's o/gate_up/down weights at its start).
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl

BULK_ASM = (
    "{ .reg .pred p; setp.gt.u32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }"
)
LINE_ASM = "{ .reg .pred p; setp.gt.u32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }"


@triton.jit
def _prefetch_kernel(ptr, n_bytes, CHUNK: tl.constexpr, BLOCK: tl.constexpr, ASM: tl.constexpr):
    base = ptr.to(tl.pointer_type(tl.uint8))
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64) * CHUNK
    size = tl.minimum(tl.maximum(n_bytes - offs, 0), CHUNK).to(tl.int32)
    tl.inline_asm_elementwise(ASM, "=r,l,r", [base + offs, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetch(t: torch.Tensor, mode: str) -> None:
    n = t.numel() * t.element_size()
    chunk, asm = (4096, BULK_ASM) if mode == "bulk" else (128, LINE_ASM)
    block = 128
    grid = (triton.cdiv(triton.cdiv(n, chunk), block),)
    _prefetch_kernel[grid](t, n, CHUNK=chunk, BLOCK=block, ASM=asm, num_warps=4)


def back_to_back_us(fn, launches: int) -> float:
    from roseinfer.bench.kernels import _graph_back_to_back_ms

    return _graph_back_to_back_ms(fn, launches) * 1e3


def gemm_row(x: torch.Tensor, ws: list[torch.Tensor], side: torch.cuda.Stream, mode: str) -> list[float]:
    """us per launch: cold, hot, prefetched one launch ahead, the prefetch kernel alone."""
    out = torch.empty(x.shape[0], ws[0].shape[0], device=x.device, dtype=x.dtype)

    def cold() -> None:
        for w in ws:
            torch.mm(x, w.t(), out=out)

    def hot() -> None:
        for _ in ws:
            torch.mm(x, ws[0].t(), out=out)

    def ahead() -> None:
        main = torch.cuda.current_stream()
        for i, w in enumerate(ws):
            if i + 1 < len(ws):
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    prefetch(ws[i + 1], mode)
            torch.mm(x, w.t(), out=out)
        main.wait_stream(side)

    def alone() -> None:
        for w in ws:
            prefetch(w, mode)

    return [back_to_back_us(f, len(ws)) for f in (cold, hot, ahead, alone)]


def gemm_probe(mode: str) -> None:
    dev = torch.device("cuda")
    batch, layers = 64, 24
    shapes = {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864)}
    side = torch.cuda.Stream()
    print(
        f"# qwen2.5-0.5b GEMMs at batch {batch}, us per launch, graph of {layers} launches; prefetch {mode}"
    )
    print(f"{'gemm':8} {'MB':>6} {'cold':>7} {'hot':>7} {'prefetched':>11} {'prefetch alone':>15}")
    for name, (n, k) in shapes.items():
        x = torch.randn(batch, k, device=dev, dtype=torch.bfloat16)
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(layers)]
        row = gemm_row(x, ws, side, mode)
        print(f"{name:8} {n * k * 2 / 1e6:6.1f} {row[0]:7.2f} {row[1]:7.2f} {row[2]:11.2f} {row[3]:15.2f}")


def patch_layer_loop(mode: str, lead: int) -> None:
    from roseinfer.models import llama

    original = llama.LlamaModel.forward
    side_streams: dict[torch.device, torch.cuda.Stream] = {}

    def weights_of(layer, whole: bool) -> list[torch.Tensor]:
        ws = [layer.self_attn.o_proj.weight, layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight]
        return ([layer.self_attn.qkv_proj.weight] + ws) if whole else ws

    def forward(self, input_ids, positions, ctx, one_token_gemv=False, deferred_norm=False):
        if not deferred_norm or mode == "none":
            return original(self, input_ids, positions, ctx, one_token_gemv, deferred_norm)
        x = self.embed_tokens(input_ids)
        main = torch.cuda.current_stream()
        side = side_streams.setdefault(x.device, torch.cuda.Stream(x.device))
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            target = i + lead
            if target < n:
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    for w in weights_of(self.layers[target], whole=lead > 0):
                        prefetch(w, mode)
            layer.forward_deferred_norm(x, positions, ctx)
        main.wait_stream(side)
        return self.norm(x)

    llama.LlamaModel.forward = forward


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["gemm", "step"])
    p.add_argument("--prefetch", default="bulk", choices=["none", "bulk", "line"])
    p.add_argument("--lead", type=int, default=1)
    p.add_argument("--batches", default="16,64,256")
    p.add_argument("--contexts", default="1024")
    args = p.parse_args()
    if args.what == "gemm":
        gemm_probe(args.prefetch)
        return
    patch_layer_loop(args.prefetch, args.lead)
    from roseinfer.bench import roofline

    parser = argparse.ArgumentParser()
    roofline.add_arguments(parser)
    rargs = parser.parse_args(
        ["--batches", args.batches, "--contexts", args.contexts, "--prefill-tokens", "512", "--iters", "100"]
    )
    print(f"# prefetch {args.prefetch}, lead {args.lead}", file=sys.stderr)
    roofline.run_roofline(rargs)


if __name__ == "__main__":
    main()
