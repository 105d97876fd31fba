"""Host time of one paged prefill attention launch, the warp-specialised kernel's (Hopper; by `DirectLaunch`; with
its K/V descriptors encoded on every call, as before they were kept; and through Triton's per-call binding, as
before either) against the Triton kernel's at the same 128 x 128 tile (by `DirectLaunch.run` since the 58th
session), and a rotary launch for scale: W7's eager long-tile layers left the GPU idle between the rotary kernel
and the WS launch (58 us a layer on average, H200 trace, PERFORMANCE.md "Fifty-fourth session"). The GPU is kept
busy by a queued sleep, so each call's time is the host's alone. GPU only.

    python scripts/probe_prefill_launch_host.py [--calls 200]
"""

from __future__ import annotations

import argparse
import time

import torch
from sweep_prefill_tiles import CASES, HEADS, build  # scripts/ is on the path when a script runs

from roseinfer.kernels import paged_prefill_ws
from roseinfer.kernels.paged_prefill_attention import paged_prefill_attention
from roseinfer.kernels.rotary import apply_rotary_and_store_kv


def host_us(launch, calls: int) -> float:
    """Median host time of `launch()` over `calls` calls, queued behind a sleep that outlasts them."""
    launch()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # ~1 s of GPU cycles
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        launch()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="1 x 1024 over 9216", choices=sorted(CASES))
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    heads = HEADS["llama-3.1-8b"]
    q, k, v, tables, qsl, sl, longest, _ = build(CASES[args.case], heads)
    out = torch.empty_like(q)

    def prefill() -> None:
        paged_prefill_attention(
            q, k, v, tables, qsl, sl, longest, heads[2] ** -0.5, out=out, block_m=128, block_n=128
        )

    def prefill_through_triton() -> None:  # the WS launch as before DirectLaunch: Triton binds every call
        paged_prefill_ws.launcher.forget()
        prefill()

    def prefill_encoding() -> None:  # the WS launch as before its descriptors were kept: encoded every call
        paged_prefill_ws.launcher.descriptors.clear()
        prefill()

    rows = [
        ("prefill 128x128 WS", host_us(prefill, args.calls)),
        ("  the same, encoding K/V", host_us(prefill_encoding, args.calls)),
        ("  the same, through Triton", host_us(prefill_through_triton, args.calls)),
    ]
    paged_prefill_ws.ENABLED = False
    rows.append(("prefill 128x128 Triton", host_us(prefill, args.calls)))
    positions = torch.arange(q.shape[0], device=q.device)
    cos_sin = torch.zeros((positions.numel() + 1, heads[2]), dtype=torch.float32, device=q.device)
    kk = torch.zeros((q.shape[0], heads[1], heads[2]), dtype=q.dtype, device=q.device)
    slots = torch.full((q.shape[0],), -1, dtype=torch.int64, device=q.device)

    def rotary() -> None:
        apply_rotary_and_store_kv(q, kk, kk, positions, cos_sin, k, v, slots)

    rows.append(("rotary + KV store", host_us(rotary, args.calls)))
    print(f"case {args.case}, llama-3.1-8b heads; host us per call (median of {args.calls}, GPU busy)")
    for name, us in rows:
        print(f"  {name:28s} {us:7.1f}")


if __name__ == "__main__":
    main()
