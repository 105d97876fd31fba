"""`Probe`: per-step counters on one engine (prompt tokens computed, prefill/decode step time, copy-on-write
copies and launches, prefix-cache hits), attached through instance attributes."""

from __future__ import annotations

import time

from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.request import Request
from roseinfer.scheduler.scheduler import SchedulerOutput


class Probe:
    """Instruments one engine through instance attributes (no engine code changes): counts the prompt
    tokens each step computes and splits step time into steps with / without prompt work, counts the
    copy-on-write copies and their batched launches, and takes the run's share of the KV manager's
    prefix-cache counters.

    Like `EngineCore.stats`, a step counts as prefill when its schedule computes prompt tokens.
    """

    def __init__(self, engine: LLMEngine) -> None:
        core = engine.core
        self.kv = core.kv
        self._schedule = core.scheduler.schedule
        self._step = core.step
        self._copy = core.runner.copy_blocks
        core.scheduler.schedule = self._on_schedule  # type: ignore[method-assign]
        core.step = self._on_step  # type: ignore[method-assign]
        core.runner.copy_blocks = self._on_copy  # type: ignore[method-assign]
        self._step_prompt_tokens = 0
        self.reset()

    def reset(self) -> None:
        self.prompt_tokens_computed = 0
        self.prefill_time = self.decode_time = 0.0
        self.prefill_steps = self.decode_steps = 0
        self.copies = self.copy_launches = 0
        self._hit0, self._queried0 = self.kv.num_hit_tokens, self.kv.num_queried_tokens

    @property
    def hit_tokens(self) -> int:
        return self.kv.num_hit_tokens - self._hit0

    @property
    def queried_tokens(self) -> int:
        return self.kv.num_queried_tokens - self._queried0

    @property
    def hit_rate(self) -> float:
        q = self.queried_tokens
        return self.hit_tokens / q if q else 0.0

    def _on_schedule(self) -> SchedulerOutput:
        out = self._schedule()
        self._step_prompt_tokens += out.num_prompt_tokens
        return out

    def _on_step(self) -> tuple[list[Request], list[Request]]:
        self._step_prompt_tokens = 0
        t0 = time.perf_counter()
        result = self._step()
        dt = time.perf_counter() - t0
        if self._step_prompt_tokens:
            self.prompt_tokens_computed += self._step_prompt_tokens
            self.prefill_time += dt
            self.prefill_steps += 1
        else:
            self.decode_time += dt
            self.decode_steps += 1
        return result

    def _on_copy(self, pairs: list[tuple[int, int]]) -> None:
        self.copy_launches += 1
        self.copies += len(pairs)
        self._copy(pairs)
