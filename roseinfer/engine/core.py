"""EngineCore.step(): schedule -> execute -> update. The only place scheduler and runner meet."""

from __future__ import annotations

import time
from dataclasses import dataclass

from torch import nn

from roseinfer.config import EngineConfig
from roseinfer.kv.manager import KVCacheManager
from roseinfer.profiling import record
from roseinfer.request import Request, RequestStatus
from roseinfer.runner.model_runner import ModelRunner
from roseinfer.scheduler.policy import AdmissionPolicy
from roseinfer.scheduler.scheduler import Scheduler


@dataclass
class StepStats:
    """Wall time of steps that held any prefill work vs pure decode steps (the notes' report split)."""

    prefill_time: float = 0.0
    decode_time: float = 0.0
    num_steps: int = 0
    num_prompt_tokens_computed: int = 0

    def reset(self) -> None:
        self.prefill_time = self.decode_time = 0.0
        self.num_steps = self.num_prompt_tokens_computed = 0


class EngineCore:
    def __init__(self, config: EngineConfig, model_path: str, model: nn.Module | None = None) -> None:
        self.config = config
        self.runner = ModelRunner(config, model_path, model)
        num_blocks = self.runner.determine_num_blocks()
        self.runner.allocate_kv_cache(num_blocks)
        self.runner.capture_graphs()
        self.kv = KVCacheManager(num_blocks, config.cache.block_size, config.cache.enable_prefix_caching)
        self.scheduler = Scheduler(
            config.scheduler, self.kv, config.max_model_len, AdmissionPolicy(config.scheduler.policy)
        )
        self.stats = StepStats()

    @property
    def num_blocks(self) -> int:
        return self.kv.num_blocks

    def add_request(self, req: Request) -> None:
        self.scheduler.add_request(req)

    def finish(self, req: Request, status: RequestStatus) -> None:
        self.scheduler.finish(req, status)
        self.runner.release(req)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> tuple[list[Request], list[Request]]:
        """Runs one step; returns (requests that got a token, requests that finished in it)."""
        with record("step"):
            return self._step()

    def _step(self) -> tuple[list[Request], list[Request]]:
        t0 = time.perf_counter()
        with record("schedule"):
            out = self.scheduler.schedule()
        if out.is_empty:
            if self.scheduler.running or self.scheduler.waiting:
                head = self.scheduler.waiting[0] if self.scheduler.waiting else self.scheduler.running[0]
                raise RuntimeError(
                    f"scheduler made no progress with {head} (KV pool of {self.num_blocks} blocks)"
                )
            return [], []
        has_prefill = out.has_prefill  # read before the update appends the first tokens
        prompt_tokens = sum(s.num_new_tokens for s in out.scheduled if s.request.num_output_tokens == 0)
        sampled = self.runner.execute(out)
        with record("update"):
            got, finished = self.scheduler.update_from_output(out, sampled)
        for req in finished:
            self.runner.release(req)
        dt = time.perf_counter() - t0
        self.stats.num_steps += 1
        if has_prefill:
            self.stats.prefill_time += dt
            self.stats.num_prompt_tokens_computed += prompt_tokens
        else:
            self.stats.decode_time += dt
        return got, finished
