"""A few cases of the randomized engine driver (tests/engine/engine_fuzz.py): tiny pools that preempt, pins,
identical prompts, greedy n > 1, small chunked-prefill budgets, aborts at random points, requests that can
never fit, sync and async; invariants every step, greedy output equal to a cache-off reference engine."""

from __future__ import annotations

import pytest

from tests.engine.engine_fuzz import Reference, run_case


@pytest.fixture(scope="module")
def reference(llama_dir: str) -> Reference:
    return Reference(llama_dir)


# 5: continuous, async, a pin, budget 1; 8: continuous, sync, a pin, 4 blocks; 12: continuous, async, lpm,
# 7 blocks for up to 8 sequences (preempts), a CPU tier.
@pytest.mark.parametrize("seed", [5, 8, 12])
def test_engine_fuzz(llama_dir: str, reference: Reference, seed: int) -> None:
    run_case(llama_dir, reference, seed)


# With a CPU tier that serves some prefix: 12 (GPU reuse too, preempts: re-admissions load), 29 (tier only,
# preempts), 36 (tier only).
@pytest.mark.parametrize("seed", [12, 29, 36])
def test_engine_fuzz_cpu_tier(llama_dir: str, reference: Reference, seed: int) -> None:
    assert run_case(llama_dir, reference, seed)["loaded"] > 0
