"""One timed run of a workload: its times and token counts, and the report lines printed for it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from roseinfer.bench.jit_watch import format_compiles


@dataclass
class RunResult:
    name: str
    num_requests: int
    prefill_time: float
    decode_time: float
    total_time: float
    prompt_tokens: int
    completion_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def completion_throughput(self) -> float:
        return self.completion_tokens / self.total_time

    @property
    def total_throughput(self) -> float:
        return self.total_tokens / self.total_time

    def report(self) -> str:
        return "\n".join(
            [
                f"=== {self.name} ===",
                f"Requests: {self.num_requests}",
                f"Elapsed (prefill/add): {self.prefill_time:.6f} seconds",
                f"Elapsed (decode/run): {self.decode_time:.6f} seconds",
                f"Elapsed (total): {self.total_time:.6f} seconds",
                f"Prompt tokens: {self.prompt_tokens}",
                f"Completion tokens: {self.completion_tokens}",
                f"Total tokens: {self.total_tokens}",
                f"Throughput (completion): {self.completion_throughput:.2f} tokens/s",
                f"Throughput (total): {self.total_throughput:.2f} tokens/s",
            ]
            + self._scheduler_line()
            + self._wait_line()
            + self._decode_step_line()
            + self._compile_line()
        )

    def _scheduler_line(self) -> list[str]:
        s = self.extra.get("scheduler")
        if s is None:
            return []
        lines = [
            f"Scheduler: {s['policy']}, {s['max_num_batched_tokens']} tokens a step, "
            f"{s['max_num_seqs']} sequences; KV cache {s.get('kv_cache_dtype', 'auto')}, "
            f"{self.extra.get('num_kv_blocks', '?')} blocks"
        ]
        paths = self.extra.get("step_paths")
        if paths:
            lines.append(
                f"Steps: {paths['decode_graph']} decode graphs, {paths['mixed_graph']} mixed-step graphs "
                f"(up to {s.get('mixed_graph_max_tokens', 0)} tokens), {paths['eager']} eager; "
                f"{paths.get('key_split', 0)} with prefill keys split, {paths.get('long_tile', 0)} in the long "
                "chunks' prefill tile"
            )
        return lines

    def _compile_line(self) -> list[str]:
        compiled = self.extra.get("triton_compiles")
        return (
            [] if compiled is None else [format_compiles(compiled, self.extra.get("triton_compile_seconds"))]
        )

    def _wait_line(self) -> list[str]:
        wait = self.extra.get("device_wait_time")
        if wait is None:
            return []
        share = 100 * wait / self.total_time if self.total_time else 0.0
        return [f"Host blocked on the device: {wait:.6f} seconds ({share:.0f}% of elapsed)"]

    def _decode_step_line(self) -> list[str]:
        """With async scheduling a step() call waits for the step before it, so in steady decode the median
        call is the device's period per step (the first decode call also waits for the last prefill)."""
        median = self.extra.get("decode_step_median_s")
        if median is None:
            return []
        n = self.extra["num_decode_steps"]
        return [f"Decode-only steps: {n}, median {median * 1e3:.3f} ms per step() call"]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            total_tokens=self.total_tokens,
            completion_throughput=self.completion_throughput,
            total_throughput=self.total_throughput,
        )
        return d
