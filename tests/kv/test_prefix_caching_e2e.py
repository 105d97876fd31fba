"""Greedy outputs are token-identical with the prefix cache on and off, over the reuse scenarios."""

from __future__ import annotations

import numpy as np
import pytest

from roseinfer import LLM, SamplingParams

BS = 4


def make(llama_dir: str, caching: bool, **kw) -> LLM:
    kw.setdefault("cpu_kv_tokens", 4096)
    return LLM(llama_dir, device="cpu", block_size=BS, enable_prefix_caching=caching, **kw)


def toks(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 384, size=n).tolist()


def greedy(max_tokens: int = 8, n: int = 1) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, n=n)


def run_rounds(llm: LLM, rounds: list[list[list[int]]], params: SamplingParams) -> list[list[list[int]]]:
    """Each round is one generate call; returns every request's sample token ids."""
    return [
        [[c.token_ids for c in o.outputs] for o in llm.generate(r, params, use_tqdm=False)] for r in rounds
    ]


def assert_clean(llm: LLM) -> None:
    core = llm.engine.core
    core.scheduler.check_invariants()
    pinned = len(core.kv.pool.pinned)
    assert core.kv.num_free_blocks == core.kv.num_blocks - pinned


BASE = toks(0, 30)

SCENARIOS = {
    "partial_overlap": [[BASE], [BASE[:13] + toks(1, 12)]],
    "overlap_ends_on_block_boundary": [[BASE], [BASE[:16] + toks(2, 9)]],
    "overlap_one_past_block_boundary": [[BASE], [BASE[:17] + toks(3, 9)]],
    "whole_prompt_hit_partial_last_block": [[BASE], [BASE], [BASE, BASE]],
    "whole_prompt_hit_block_aligned": [[BASE[:28]], [BASE[:28]]],
    "identical_prompts_in_one_batch": [[BASE, BASE, BASE[:21], BASE]],
    "single_token_prompt_twice": [[[7]], [[7]]],
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_identical_on_and_off(llama_dir, name):
    rounds = SCENARIOS[name]
    on, off = make(llama_dir, True), make(llama_dir, False)
    assert run_rounds(on, rounds, greedy()) == run_rounds(off, rounds, greedy())
    # Hits count the tokens served from the cache: a one-token prompt is always computed (its logits).
    assert (on.engine.core.kv.num_hit_tokens > 0) == (name != "single_token_prompt_twice")
    assert off.engine.core.kv.num_hit_tokens == 0
    assert_clean(on)


def test_num_cached_tokens_reported(llama_dir):
    llm = make(llama_dir, True)
    first = llm.generate([BASE], greedy(), use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    again = llm.generate([BASE[:17] + toks(5, 6)], greedy(), use_tqdm=False)[0]
    assert again.num_cached_tokens == 16  # block granularity: 4 full blocks
    whole = llm.generate([BASE], greedy(), use_tqdm=False)[0]
    assert whole.num_cached_tokens == 29  # all 30 cached; the last one is recomputed for its logits
    kv = llm.engine.core.kv
    # As vLLM's: the hits are the tokens served from the cache, what the outputs report.
    assert kv.num_hit_tokens == 16 + 29 == again.num_cached_tokens + whole.num_cached_tokens
    assert kv.num_queried_tokens == 30 + 23 + 30 and kv.hit_rate == 45 / 83


def test_multi_turn_reuses_previous_turn(llama_dir):
    on, off = make(llama_dir, True), make(llama_dir, False)
    for llm in (on, off):
        out1 = llm.generate([BASE], greedy(12), use_tqdm=False)[0]
        turn2 = BASE + out1.outputs[0].token_ids + toks(9, 7)
        llm.turn2 = llm.generate([turn2], greedy(12), use_tqdm=False)[0]
    assert on.turn2.outputs[0].token_ids == off.turn2.outputs[0].token_ids
    # The previous turn's prompt and all but its last generated token (whose KV was never written) hit.
    assert on.turn2.num_cached_tokens == (len(BASE) + 11) // BS * BS


def test_n_samples_share_the_prompt(llama_dir):
    on, off = make(llama_dir, True), make(llama_dir, False)
    single = off.generate([BASE], greedy(10), use_tqdm=False)[0].outputs[0].token_ids
    for llm in (on, off):
        out = llm.generate([BASE], greedy(10, n=3), use_tqdm=False)[0]
        assert [c.index for c in out.outputs] == [0, 1, 2]
        assert all(c.token_ids == single for c in out.outputs)
        assert_clean(llm)
    sampled = on.generate(
        [BASE], SamplingParams(temperature=1.0, max_tokens=10, n=4, seed=5, ignore_eos=True), use_tqdm=False
    )[0]
    assert len({tuple(c.token_ids) for c in sampled.outputs}) > 1
    again = on.generate(
        [BASE], SamplingParams(temperature=1.0, max_tokens=10, n=4, seed=5, ignore_eos=True), use_tqdm=False
    )[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in sampled.outputs]


def test_n_samples_prefill_once_and_share_blocks(llama_dir):
    llm = make(llama_dir, True)
    engine = llm.engine
    engine.add_request(BASE, greedy(4, n=3))
    got = engine.step()  # the whole prompt fits one step: prefill + fork
    assert [c.index for o in got for c in o.outputs] == [0, 1, 2]  # one output a sample (as vLLM v1)
    running = engine.core.scheduler.running
    assert len(running) == 3
    tables = [r.block_ids for r in running]
    assert tables[0] == tables[1] == tables[2]
    pool = engine.core.kv.pool
    assert all(pool.ref_counts[b] == 3 for b in tables[0])
    assert engine.core.stats.num_prompt_tokens_computed == len(BASE)
    out = engine.step()  # first decode: the shared partial block is copied for all but one sample
    assert len(out) == (0 if engine.config.async_scheduling else 3)  # async: its tokens come next step
    tables = [r.block_ids for r in running]
    assert len({t[-1] for t in tables}) == 3 and all(t[:-1] == tables[0][:-1] for t in tables)
    while engine.has_unfinished_requests():
        engine.step()
    assert_clean(llm)


def test_pinned_prefix_survives_memory_pressure(llama_dir):
    system = toks(11, 37)  # page-aligned to 36 tokens
    on = make(llama_dir, True, num_kv_blocks=40, pinned_prefixes=[system])
    off = make(llama_dir, False, num_kv_blocks=40)
    assert on.pinned_tokens == [36]
    pinned = set(on.engine.core.kv.pool.pinned)
    assert len(pinned) == 9
    # Fill the pool with unrelated prompts, forcing evictions of everything that is not pinned.
    flood = [toks(100 + i, 60) for i in range(6)]
    requests = [system + toks(20 + i, 5) for i in range(3)]
    rounds = [flood, requests, flood[:2], requests]
    assert run_rounds(on, rounds, greedy(6)) == run_rounds(off, rounds, greedy(6))
    assert on.engine.core.kv.pool.num_evictions > 0
    assert set(on.engine.core.kv.pool.pinned) == pinned
    outs = on.generate(requests, greedy(2), use_tqdm=False)
    assert all(o.num_cached_tokens >= 36 for o in outs)
    assert_clean(on)


def test_eviction_under_memory_pressure(llama_dir):
    prompts = [toks(200 + i, 40) for i in range(8)]
    rounds = [prompts[:4], prompts[4:], prompts[:4], [p[:20] + toks(300, 5) for p in prompts]]
    on, off = make(llama_dir, True, num_kv_blocks=48), make(llama_dir, False, num_kv_blocks=48)
    assert run_rounds(on, rounds, greedy(6)) == run_rounds(off, rounds, greedy(6))
    pool = on.engine.core.kv.pool
    assert pool.num_evictions > 0
    assert len(pool.cached) <= pool.num_blocks
    assert_clean(on)


def test_preemption_of_requests_holding_shared_blocks(llama_dir):
    shared = toks(400, 22)
    prompts = [shared + toks(401 + i, 3 + i) for i in range(6)] + [shared] * 2
    on = make(llama_dir, True, num_kv_blocks=30)
    off = make(llama_dir, False, cpu_kv_tokens=4096)
    want = run_rounds(off, [[shared], prompts], greedy(16))
    got = run_rounds(on, [[shared], prompts], greedy(16))
    assert on.engine.core.scheduler.num_preemptions > 0, "the pool must be too small for all at once"
    assert got == want
    assert_clean(on)


def test_salted_requests_do_not_share(llama_dir):
    llm = make(llama_dir, True)
    a = {"prompt_token_ids": BASE, "cache_salt": "tenant-a"}
    b = {"prompt_token_ids": BASE, "cache_salt": "tenant-b"}
    outs = [llm.generate([p], greedy(4), use_tqdm=False)[0] for p in (a, b, BASE)]
    assert [o.num_cached_tokens for o in outs] == [0, 0, 0]
    assert llm.generate([a], greedy(4), use_tqdm=False)[0].num_cached_tokens == 29
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) == 1  # same model, same answer
