"""What every workload of `bench prefix` shares: the `PrefixBench` context (options, model, one set of
weights, fresh engines on it), the cache modes, and the table / percentile / median helpers."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from roseinfer.bench.device import free_memory
from roseinfer.bench.engine_run import engine_kwargs
from roseinfer.bench.workloads import Workload, build_workload
from roseinfer.config import ModelConfig
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.llm import make_engine_config

CACHE_MODES = (False, True)  # off first, then on


def cache_name(on: bool) -> str:
    return "on" if on else "off"


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile; NaN for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def format_table(title: str, columns: Sequence[tuple[str, str, str]], rows: Sequence[dict[str, Any]]) -> str:
    """`columns`: (key, heading, format spec). Missing or None values print as "-"."""

    def cell(row: dict[str, Any], key: str, spec: str) -> str:
        value = row.get(key)
        if value is None or (isinstance(value, float) and np.isnan(value)):
            return "-"
        return format(value, spec)

    cells = [[cell(r, k, spec) for k, _, spec in columns] for r in rows]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, (_, h, _) in enumerate(columns)]
    line = "  ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths))
    out = [f"=== {title} ===", line, "-" * len(line)]
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


@dataclass
class PrefixBench:
    """What every workload of the command shares: the options, the model, and its one set of weights."""

    args: argparse.Namespace
    model_name: str
    model_config: ModelConfig
    device: torch.device
    dtype: torch.dtype
    shared_model: nn.Module | None = None
    progress: bool = True

    def make_engine(
        self,
        workload: Workload,
        prefix_caching: bool,
        mode: str = "continuous",
        defaults: dict[str, Any] | None = None,
    ) -> LLMEngine:
        """A fresh engine on the shared weights; `defaults` apply where the user gave no option."""
        kw = engine_kwargs(self.args, workload, mode)
        for name, value in (defaults or {}).items():
            if getattr(self.args, name, None) is None:
                kw[name] = value
        kw["enable_prefix_caching"] = prefix_caching
        config, path = make_engine_config(self.model_name, **kw)
        engine = LLMEngine(config, path, self.shared_model)
        self.shared_model = engine.core.runner.model
        return engine

    def free(self) -> None:
        free_memory(self.device)

    def repeats(self, default: int) -> int:
        r = self.args.repeats
        return max(1, r if r is not None else default)


def median_by(runs: list[Any], key: Callable[[Any], float]) -> Any:
    return sorted(runs, key=key)[(len(runs) - 1) // 2]


def offline_workload(bench: PrefixBench, workload_id: str) -> Workload:
    a = bench.args
    return build_workload(
        workload_id,
        bench.model_config.vocab_size,
        num_requests=a.num_requests,
        max_prompt_len=a.max_prompt_len,
        max_output_len=a.max_output_len,
        seed=a.seed,
    )
