"""Scheduler + KV cache manager against a simulated KV whose every read is checked (tests/scheduler/
kv_content_sim.py): tiny pools, prefix caching on and off, pins, identical prompts, n > 1, chunked prefill
under small budgets, aborts at random points, all modes and admission policies, sync and async; half the
caching cases with a CPU tier (a tiny one, often thrashed), some reusing prefixes from it alone."""

from __future__ import annotations

import random

import pytest

from roseinfer.config import SchedulerConfig
from roseinfer.kv.manager import KVCacheManager
from roseinfer.request import Request, RequestStatus
from roseinfer.sampling_params import SamplingParams
from roseinfer.scheduler.policy import AdmissionPolicy
from roseinfer.scheduler.scheduler import Scheduler
from tests.scheduler.kv_content_sim import STOP, SimEngine, reference


def run_case(seed: int) -> SimEngine:
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 8])
    num_blocks = rng.randint(3, 40)
    caching = rng.random() < 0.75
    mode = rng.choice(["continuous", "continuous", "continuous", "static", "naive"])
    chunked = rng.random() < 0.7
    budget = rng.choice([1, 2, 3, 8, 64]) if chunked else rng.choice([8, 16, 64])
    max_len = rng.choice([40, 64, 10_000])
    # Drawn apart, so that each seed's other choices stay what they were before the CPU tier existed.
    offload_rng = random.Random(seed + 10_000)
    num_cpu_blocks = offload_rng.randint(1, 40) if caching and offload_rng.random() < 0.5 else 0
    gpu_reuse = not num_cpu_blocks or offload_rng.random() < 0.7
    kv = KVCacheManager(num_blocks, bs, caching, num_cpu_blocks, gpu_reuse)
    policy = AdmissionPolicy(rng.choice(["fcfs", "lpm", "lof"]), max_wait_steps=rng.randint(1, 8))
    sched = Scheduler(SchedulerConfig(rng.randint(1, 8), budget, mode, chunked), kv, max_len, policy)
    sim = SimEngine(sched, async_=rng.random() < 0.5, rng=offload_rng)
    bases = [[rng.randint(10, 60) for _ in range(rng.randint(1, 24))] for _ in range(3)]

    # Pins, as LLMEngine.pin_prefix does (with no request in the engine): run the aligned prefix alone, then
    # pin its cached full blocks.
    pinned: dict[int, list[int | None]] = {}

    def pin(base: list[int]) -> None:
        aligned = base[: len(base) - len(base) % bs]
        req = Request("pin", aligned, SamplingParams(max_tokens=1, ignore_eos=True))
        if aligned and (chunked or len(aligned) <= budget) and valid(aligned, 1, req):
            sim.add(req)
            while sim.has_unfinished():
                sim.step()
            kv.pin(Request("pin", aligned, SamplingParams(max_tokens=1)))
            pinned.update({b: list(sim.store[b]) for b in kv.pool.pinned if b not in pinned})

    def valid(prompt: list[int], max_tokens: int, req: Request) -> bool:
        if len(prompt) >= max_len or len(prompt) + max_tokens > max_len:
            return False
        if not chunked and len(prompt) > budget:
            return False
        if len(prompt) + max_tokens > num_blocks * bs:
            return False
        return kv.blocks_for(len(prompt) + max_tokens) <= kv.blocks_open_to(req)

    if caching and rng.random() < 0.4:
        pin(rng.choice(bases))
    aborted: set[int] = set()
    user: list[Request] = []
    for _ in range(300):
        if rng.random() < 0.4 and len(user) < 30:
            base = rng.choice(bases)
            if rng.random() < 0.3 and user:
                prompt = list(rng.choice(user).prompt_token_ids)  # an identical prompt
            else:
                prompt = base[: rng.randint(1, len(base))] + [
                    rng.randint(10, 60) for _ in range(rng.randint(0, 5))
                ]
            mt = rng.randint(1, 10)
            stop = rng.random() < 0.3
            params = SamplingParams(
                max_tokens=mt,
                n=rng.choice([1, 1, 1, 2, 3]),
                ignore_eos=True,
                stop_token_ids=[STOP] if stop else [],
            )
            req = Request(f"r{len(user)}", prompt, params, cache_salt=rng.choice([None, None, None, "s"]))
            if valid(prompt, mt, req):
                user.append(req)
                sim.add(req)
        if rng.random() < 0.08 and sim.requests:  # abort anyone: waiting, running, preempted or finished
            victim = rng.choice(sim.requests)
            family = [victim] + [r for r in sim.requests if r.parent is victim]  # as LLMEngine aborts a group
            for r in family if rng.random() < 0.5 else [victim]:
                if not r.is_finished:
                    aborted.add(r.uid)
                sched.finish(r, RequestStatus.FINISHED_ABORTED)
            sim.check_after()
        if not sim.has_unfinished():
            if caching and rng.random() < 0.1:
                pin(rng.choice(bases))  # later, over a warm cache
            continue
        was_inflight = sim.inflight is not None or bool(sim.stores)
        out = sim.step()
        assert not (out.is_empty and not was_inflight), f"stalled: {list(sched.waiting)} {sched.running}"
        for b, content in pinned.items():
            assert b in kv.pool.pinned and kv.pool.ref_counts[b] >= 1 and sim.store[b] == content
    for _ in range(5000):
        if not sim.has_unfinished():
            break
        was_inflight = sim.inflight is not None or bool(sim.stores)
        out = sim.step()
        assert not (out.is_empty and not was_inflight), f"stalled: {list(sched.waiting)} {sched.running}"
    assert not sim.has_unfinished()
    for r in sim.requests:
        assert r.is_finished and not r.block_ids and r.num_pending == 0, r
        if not caching:
            assert r.num_cached_tokens == 0
        else:
            assert r.num_cached_tokens < r.num_prompt_tokens
        want = reference(
            r.prompt_token_ids, r.sample_index, r.params.max_tokens, bool(r.params.stop_token_ids), max_len
        )
        if r.uid in aborted:
            assert r.output_token_ids == want[: len(r.output_token_ids)], r
        else:
            assert r.status is not RequestStatus.FINISHED_ABORTED and r.output_token_ids == want, r
    assert kv.num_free_blocks == num_blocks - len(kv.pool.pinned)
    assert kv.tables.rows_in_use == 0 and not kv.tables.array.any()
    assert not sim.pending or not any(sim.pending.values())
    return sim


@pytest.mark.parametrize("seed", range(200))
def test_kv_content_fuzz(seed: int) -> None:
    run_case(seed)
