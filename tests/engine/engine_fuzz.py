"""A randomized LLMEngine driver: tiny pools, prefix caching on/off, pins, identical prompts, greedy n > 1,
chunked prefill under small budgets, aborts at random points, requests that can never fit, every mode and
admission policy, sync and async, a CPU tier (sometimes the only reuse), min_tokens holding off a stop id the request would generate, presence /
frequency / repetition penalties. Invariants after every step; greedy output against a reference engine with
every cache feature off."""

from __future__ import annotations

import gc
import random
import weakref
from collections import defaultdict
from dataclasses import replace

from roseinfer import LLM, CompletionOutput, SamplingParams
from roseinfer.request import Request


class Reference:
    """Greedy outputs of an engine with prefix caching off, a big pool and no chunking pressure."""

    def __init__(self, model_dir: str) -> None:
        self.llm = LLM(
            model_dir,
            device="cpu",
            dtype="float32",
            block_size=4,
            enable_prefix_caching=False,
            async_scheduling=False,
            cpu_kv_tokens=4096,
        )
        self.memo: dict[tuple, list[int]] = {}

    def __call__(self, prompt: list[int], params: SamplingParams) -> list[int]:
        penalties = (params.presence_penalty, params.frequency_penalty, params.repetition_penalty)
        key = (tuple(prompt), params.max_tokens, tuple(params.stop_token_ids), params.min_tokens, penalties)
        if key not in self.memo:
            p = SamplingParams(
                temperature=0.0,
                max_tokens=params.max_tokens,
                ignore_eos=True,
                stop_token_ids=params.stop_token_ids,
                min_tokens=params.min_tokens,
                presence_penalty=params.presence_penalty,
                frequency_penalty=params.frequency_penalty,
                repetition_penalty=params.repetition_penalty,
            )
            self.memo[key] = self.llm.generate([prompt], p, use_tqdm=False)[0].outputs[0].token_ids
        return self.memo[key]


def with_penalties(params: SamplingParams, rng: random.Random) -> SamplingParams:
    """`params` with random presence, frequency and repetition penalties, a third of the time."""
    if rng.random() >= 1 / 3:
        return params
    return replace(
        params,
        presence_penalty=rng.choice([0.0, -1.0, 1.5]),
        frequency_penalty=rng.choice([0.0, 0.7, 2.0]),
        repetition_penalty=rng.choice([1.0, 0.8, 1.5, 3.0]),
    )


def check_step(llm: LLM) -> None:
    core = llm.engine.core
    sched = core.scheduler
    sched.check_invariants()
    for r in list(sched.running) + list(sched.waiting):
        assert not r.is_finished, r


def run_case(model_dir: str, ref: Reference, seed: int, steps: int = 60) -> dict:
    rng = random.Random(seed)
    bs = rng.choice([2, 4, 8])
    caching = rng.random() < 0.75
    chunked = rng.random() < 0.75
    budget = rng.choice([1, 3, 8, 64]) if chunked else rng.choice([16, 64])
    kw = dict(
        block_size=bs,
        num_kv_blocks=rng.randint(3, 24),
        enable_prefix_caching=caching,
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=budget,
        max_num_seqs=rng.choice([1, 2, 4, 8]),
        scheduler_mode=rng.choice(["continuous", "continuous", "static", "naive"]),
        admission_policy=rng.choice(["fcfs", "lpm", "lof"]),
        async_scheduling=rng.random() < 0.5,
    )
    # The CPU tier, from a stream of its own so that the cases' other draws stay as they were.
    tier = random.Random(seed + 20_000)
    if caching and tier.random() < 0.5:
        kw.update(num_cpu_blocks=tier.randint(2, 40), gpu_prefix_reuse=tier.random() < 0.7)
    bases = [[rng.randint(3, 300) for _ in range(rng.randint(2, 20))] for _ in range(3)]
    pins = []
    if caching and rng.random() < 0.4:
        pins = [b[: len(b) - len(b) % bs] for b in bases[:1] if len(b) >= bs]
        too_big = any(
            len(p) + bs > kw["num_kv_blocks"] * bs // 2 or (not chunked and len(p) > budget) for p in pins
        )
        if too_big:
            pins = []
    llm = LLM(model_dir, device="cpu", dtype="float32", pinned_prefixes=pins, **kw)
    eng = llm.engine
    core = eng.core
    pinned_blocks = set(core.kv.pool.pinned)
    submitted: dict[str, tuple[list[int], SamplingParams]] = {}
    aborted: set[str] = set()
    finals: dict[str, object] = {}
    # Each sample's last output: a streamed n > 1 request's outputs hold one sample each (as vLLM v1's).
    last: dict[str, dict[int, CompletionOutput]] = defaultdict(dict)
    refs: list[weakref.ref] = []
    n_rejected = 0
    for i in range(steps):
        if rng.random() < 0.5 and len(submitted) < 16:
            base = rng.choice(bases)
            if rng.random() < 0.3 and submitted:
                prompt = list(rng.choice(list(submitted.values()))[0])
            else:
                prompt = base[: rng.randint(1, len(base))] + [
                    rng.randint(3, 300) for _ in range(rng.randint(0, 6))
                ]
            params = SamplingParams(
                temperature=0.0,
                max_tokens=rng.randint(1, 12),
                n=min(rng.choice([1, 1, 1, 2, 3]), kw["max_num_seqs"]),  # the front door rejects more
                ignore_eos=True,
                stop_token_ids=[rng.randint(3, 300)] if rng.random() < 0.2 else [],
            )
            # Penalties (their counts must survive preemption, chunks and async scheduling), from a stream
            # of their own, so that the cases' other draws stay as they were.
            params = with_penalties(params, random.Random(seed * 7_000_003 + i))
            # From a stream of its own, so that the cases' other draws stay as they were: a stop id the
            # request generates, held off by a min_tokens (its count must survive preemption and chunks).
            extra = random.Random(seed * 1_000_003 + i)
            if extra.random() < 0.3:
                free = ref(prompt, replace(params, stop_token_ids=[], min_tokens=0))
                stop = free[extra.randrange(len(free))]
                params = replace(
                    params, stop_token_ids=[stop], min_tokens=extra.randint(0, params.max_tokens)
                )
            rid = f"r{i}"
            try:
                eng.add_request(prompt, params, request_id=rid)
            except ValueError:
                n_rejected += 1
                assert (
                    len(prompt) + params.max_tokens > kw["num_kv_blocks"] * bs
                    or (not chunked and len(prompt) > budget)
                    or core.kv.blocks_for(len(prompt) + params.max_tokens)
                    > core.kv.blocks_open_to(Request("q", prompt, params))
                ), (prompt, params)
            else:
                submitted[rid] = (prompt, params)
                refs.append(weakref.ref(eng.groups[rid].root))
        if rng.random() < 0.12 and submitted:  # abort anything: waiting, running, preempted, finished
            rid = rng.choice(list(submitted))
            if rid not in finals:
                aborted.add(rid)
            eng.abort_request(rid)
        if eng.has_unfinished_requests():
            for out in eng.step(final_only=rng.random() < 0.5):
                last[out.request_id].update((c.index, c) for c in out.outputs)
                if out.finished:
                    assert out.request_id not in finals, f"{out.request_id} finished twice"
                    finals[out.request_id] = out
            check_step(llm)
            assert pinned_blocks <= core.kv.pool.pinned
    for _ in range(2000):
        if not eng.has_unfinished_requests():
            break
        for out in eng.step(final_only=True):
            last[out.request_id].update((c.index, c) for c in out.outputs)
            assert out.request_id not in finals
            finals[out.request_id] = out
        check_step(llm)
    assert not eng.has_unfinished_requests()
    # Invariant 4: nothing held, nothing left behind.
    core.scheduler.check_invariants()
    assert core.kv.num_free_blocks == core.kv.num_blocks - len(core.kv.pool.pinned)
    assert core.kv.pool.pinned == pinned_blocks
    assert not eng.groups, eng.groups
    assert not core.runner.sampling.generators
    assert core.runner.sampling.penalty_table is None or not core.runner.sampling.penalty_table.slot_of
    assert core.kv.tables.rows_in_use == 0
    for rid, (prompt, params) in submitted.items():
        if rid in aborted:
            assert all(c.token_ids == ref(prompt, params)[: len(c.token_ids)] for c in last[rid].values())
            continue
        out = finals[rid]
        want = ref(prompt, params)
        assert sorted(last[rid]) == list(range(params.n))
        for c in last[rid].values():
            assert c.token_ids == want, (rid, prompt, params, kw, pins)
        if not caching:
            assert out.num_cached_tokens == 0
        assert out.num_cached_tokens < len(prompt)
    del finals, last
    gc.collect()
    alive = [r() for r in refs if r() is not None]
    assert not alive, f"{len(alive)} finished requests still referenced: {alive[:3]}"
    return {
        "rejected": n_rejected,
        "preemptions": core.scheduler.num_preemptions,
        "hits": core.kv.num_hit_tokens,
        "loaded": core.kv.num_loaded_tokens,
    }
