"""What an engine's start-up took, stage by stage: seconds and device memory, as vLLM's start-up log lines tell
(model loading, KV cache size, graph capture time and memory). `EngineCore.startup` holds it; benchmarks print it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from roseinfer.runner.kv_sizing import GIB

# The line leaves out a stage under both (a warm-up that compiled nothing, say), and GiB under the second.
SHOWN_SECONDS = 0.05
SHOWN_BYTES = GIB // 100


@dataclass(frozen=True)
class StartupStage:
    name: str
    seconds: float
    # The drop in the device's free memory over the stage (`torch.cuda.mem_get_info`): what the stage kept. The
    # first reading, before any stage, makes the CUDA context, so no stage counts it. 0 off CUDA.
    device_bytes: int


class StartupTimer:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stages: list[StartupStage] = []

    def _free(self) -> int:
        return torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else 0

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        free, t0 = self._free(), time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.stages.append(StartupStage(name, time.perf_counter() - t0, free - self._free()))


@dataclass(frozen=True)
class StartupReport:
    stages: tuple[StartupStage, ...]
    num_blocks: int
    block_size: int
    num_decode_graphs: int
    num_mixed_graphs: int

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    def stage(self, name: str) -> StartupStage:
        return next(s for s in self.stages if s.name == name)

    def line(self) -> str:
        """One line: the stages' seconds (and GiB where one kept device memory; a stage of neither is left out),
        the KV cache, the graphs."""
        parts = [
            f"{s.name} {s.seconds:.1f} s"
            + (f", {s.device_bytes / GIB:.2f} GiB" if s.device_bytes >= SHOWN_BYTES else "")
            for s in self.stages
            if s.seconds >= SHOWN_SECONDS or s.device_bytes >= SHOWN_BYTES
        ]
        graphs = self.num_decode_graphs + self.num_mixed_graphs
        return (
            f"Start-up: {self.seconds:.1f} s ({'; '.join(parts)}); KV cache {self.num_blocks:,} blocks = "
            f"{self.num_blocks * self.block_size:,} tokens; "
            + (
                f"CUDA graphs: {self.num_decode_graphs} decode, {self.num_mixed_graphs} mixed-step"
                if graphs
                else "no CUDA graphs"
            )
        )

    def to_dict(self) -> dict:
        return asdict(self) | {"stages": [asdict(s) for s in self.stages], "seconds": self.seconds}
