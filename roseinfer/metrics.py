"""The engine's counters and gauges as a list of metrics, shaped as vLLM v1's `LLM.get_metrics()` gives them (a name,
labels and a value each), so that code reading one engine's reads the other's; names take a `roseinfer:` prefix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from roseinfer.engine.llm_engine import LLMEngine
    from roseinfer.kv.manager import KVCacheManager

FINISH_REASONS = ("stop", "length", "abort")  # RequestStatus values of the finished states


@dataclass(frozen=True)
class Metric:
    name: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Counter(Metric):
    """Only grows over the engine's life."""

    value: int = 0


@dataclass(frozen=True)
class Gauge(Metric):
    """A reading of the engine's state now."""

    value: float = 0.0


def engine_metrics(engine: LLMEngine) -> list[Metric]:
    """Every metric of `engine` now. Requests count one each per sample (n > 1 runs n), as in vLLM v1's engine core;
    pinned prefixes count too, as the one-token requests they run as."""
    core = engine.core
    scheduler, kv = core.scheduler, core.kv
    finished = scheduler.num_finished
    return [
        Gauge("roseinfer:num_requests_running", value=float(len(scheduler.running))),
        Gauge("roseinfer:num_requests_waiting", value=float(len(scheduler.waiting))),
        # Blocks some request holds; cached blocks nobody holds count as free (they are evicted on demand).
        Gauge("roseinfer:kv_cache_usage_perc", value=kv.usage()),
        Counter("roseinfer:prefix_cache_queries", value=kv.num_queried_tokens),  # prompt tokens looked up
        Counter("roseinfer:prefix_cache_hits", value=kv.num_hit_tokens),  # of those, tokens found cached
        Counter("roseinfer:num_preemptions", value=scheduler.num_preemptions),
        Counter("roseinfer:prompt_tokens", value=engine.num_prompt_tokens),  # of the requests added
        Counter("roseinfer:generation_tokens", value=engine.num_generated_tokens),
        *(
            Counter("roseinfer:request_success", {"finished_reason": reason}, finished[reason])
            for reason in FINISH_REASONS
        ),
        *cpu_tier_metrics(kv),
    ]


def cpu_tier_metrics(kv: KVCacheManager) -> list[Metric]:
    """The CPU tier's, where there is one: its slots in use, prompt tokens loaded from it (a part of
    prefix_cache_hits, re-admissions after preemption aside), blocks stored into it and evicted from it."""
    tier = kv.cpu
    if tier is None:
        return []
    return [
        Gauge("roseinfer:cpu_cache_usage_perc", value=tier.num_used / tier.num_slots),
        Counter("roseinfer:cpu_prefix_cache_loaded_tokens", value=kv.num_loaded_tokens),
        Counter("roseinfer:cpu_cache_stored_blocks", value=tier.num_stores),
        Counter("roseinfer:cpu_cache_evictions", value=tier.num_evictions),
    ]
