"""Run the vLLM peer benchmark (shared/peers/vllm/bench_w1_w2.py) with vLLM's KV cache in fp8.

    python3 scripts/vllm_kv_fp8.py PATH/bench_w1_w2.py [its arguments]

The peer script builds `vllm.LLM(...)` with its own arguments and has no KV dtype option; this wraps the
constructor so that every engine it builds also gets `kv_cache_dtype="fp8"` (e4m3, scale 1.0: vLLM's default
without calibrated scales, and what `roseinfer --kv-cache-dtype fp8` stores). The peer script itself is
run unchanged.
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    import vllm

    build = vllm.LLM

    def llm_with_fp8_cache(*args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs.setdefault("kv_cache_dtype", "fp8")
        return build(*args, **kwargs)

    vllm.LLM = llm_with_fp8_cache  # type: ignore[misc]
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
