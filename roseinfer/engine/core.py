"""EngineCore.step(): schedule -> execute -> update. The only place scheduler and runner meet."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from torch import nn

from roseinfer.config import EngineConfig
from roseinfer.engine.startup import StartupReport, StartupTimer
from roseinfer.kv.manager import KVCacheManager
from roseinfer.profiling import record
from roseinfer.request import Request, RequestStatus
from roseinfer.runner.kv_offload import cpu_tier_num_blocks
from roseinfer.runner.model_runner import ModelRunner
from roseinfer.runner.step_future import StepFuture
from roseinfer.scheduler.policy import AdmissionPolicy
from roseinfer.scheduler.scheduler import Scheduler, SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass
class StepStats:
    """Wall time of steps that held any prefill work vs pure decode steps (the notes' report split).

    A step() call is booked by the step it schedules. With async scheduling the call also waits for the
    step before it, so each step's device time lands one call late (a prefill's on the decode after it);
    the split is exact only with async scheduling off."""

    prefill_time: float = 0.0
    decode_time: float = 0.0
    num_steps: int = 0
    num_prompt_tokens_computed: int = 0
    # Host time spent blocked on the device for a step's tokens: near zero means the host, not the GPU,
    # sets the pace (with async scheduling the host prepares step N+1 while step N runs).
    device_wait_time: float = 0.0

    def reset(self) -> None:
        self.prefill_time = self.decode_time = self.device_wait_time = 0.0
        self.num_steps = self.num_prompt_tokens_computed = 0


class EngineCore:
    def __init__(self, config: EngineConfig, model_path: str, model: nn.Module | None = None) -> None:
        self.config = config
        timer = StartupTimer(config.device)
        with timer.stage("load model"):
            self.runner = ModelRunner(config, model_path, model)
        with timer.stage("profile"):
            num_blocks = self.runner.determine_num_blocks()
        with timer.stage("KV cache"):
            self.runner.allocate_kv_cache(num_blocks)
        num_cpu_blocks = (
            cpu_tier_num_blocks(config.cache, self.runner.block_bytes()) if config.cache.offloads else 0
        )
        if num_cpu_blocks:
            with timer.stage("CPU tier"):
                self.runner.allocate_cpu_tier(num_cpu_blocks)
        with timer.stage("kernel warm-up"):
            self.runner.warm_up()
        with timer.stage("CUDA graphs"):
            self.runner.capture_graphs()
        self.startup = StartupReport(
            tuple(timer.stages), num_blocks, config.cache.block_size, *self.runner.num_graphs()
        )
        logger.info("%s", self.startup.line())
        self.kv = KVCacheManager(
            num_blocks,
            config.cache.block_size,
            config.cache.enable_prefix_caching,
            num_cpu_blocks,
            config.cache.gpu_prefix_reuse,
        )
        self.scheduler = Scheduler(
            config.scheduler, self.kv, config.max_model_len, AdmissionPolicy(config.scheduler.policy)
        )
        self.stats = StepStats()
        self.inflight: tuple[SchedulerOutput, StepFuture] | None = None  # launched, tokens not applied yet

    @property
    def num_blocks(self) -> int:
        return self.kv.num_blocks

    def add_request(self, req: Request) -> None:
        self.scheduler.add_request(req)

    def finish(self, req: Request, status: RequestStatus) -> None:
        self.scheduler.finish(req, status)
        self.runner.release(req)

    def has_unfinished(self) -> bool:
        """Requests to run, a step in flight, or stores into the CPU tier not known done (whose blocks they hold)."""
        offloader = self.runner.offloader
        return (
            self.scheduler.has_unfinished()
            or self.inflight is not None
            or (offloader is not None and offloader.busy)
        )

    def _collect_stores(self, wait: bool = False) -> bool:
        """Hands the stores into the CPU tier that finished back to the KV cache manager; whether there were any."""
        offloader = self.runner.offloader
        done = offloader.completed(wait) if offloader is not None else []
        if done:
            self.kv.stores_done(done)
        return bool(done)

    def step(self) -> tuple[list[Request], list[Request]]:
        """Runs one step; returns (requests that got a token, requests that finished in it).

        With async scheduling the tokens returned are those of the step launched by the previous call:
        this call schedules and launches the next step first, so the device never waits for the host.
        """
        with record("step"):
            return self._step()

    def _step(self) -> tuple[list[Request], list[Request]]:
        t0 = time.perf_counter()
        if self.runner.offloader is not None:
            self._collect_stores()
        with record("schedule"):
            out = self.scheduler.schedule()
        if out.preempted:  # told even where nothing runs this step: the rows must be free for the next
            self.runner.preempted(out.preempted)
        if out.is_empty:
            if out.kv_stores:
                self.runner.store_kv(out.kv_stores)
            if self.inflight is not None:  # nothing can be scheduled until the step in flight is known
                return self._resolve()
            if self._collect_stores(wait=True):  # their blocks may be what the waiting need
                return [], []
            if self.scheduler.running or self.scheduler.waiting:
                head = self.scheduler.waiting[0] if self.scheduler.waiting else self.scheduler.running[0]
                raise RuntimeError(
                    f"scheduler made no progress with {head} (KV pool of {self.num_blocks} blocks)"
                )
            return [], []
        future = self.runner.launch(out)
        got, finished = self._resolve() if self.inflight is not None else ([], [])
        self.inflight = (out, future)
        if not self.config.async_scheduling or out.forks:  # forks join the running set in the update
            more_got, more_finished = self._resolve()
            got, finished = got + more_got, finished + more_finished
        dt = time.perf_counter() - t0
        self.stats.num_steps += 1
        if out.has_prefill:
            self.stats.prefill_time += dt
            self.stats.num_prompt_tokens_computed += out.num_prompt_tokens
        else:
            self.stats.decode_time += dt
        return got, finished

    def _resolve(self) -> tuple[list[Request], list[Request]]:
        """Waits for the step in flight and applies its tokens."""
        assert self.inflight is not None
        out, future = self.inflight
        self.inflight = None
        t0 = time.perf_counter()
        sampled = future.result()
        self.stats.device_wait_time += time.perf_counter() - t0
        for index, first, entries in future.prompt_logprobs():
            out.scheduled[index].request.add_prompt_logprobs(first, entries)
        with record("update"):
            got, finished = self.scheduler.update_from_output(out, sampled, future.logprobs())
        for req in finished:
            self.runner.release(req)
        return got, finished
