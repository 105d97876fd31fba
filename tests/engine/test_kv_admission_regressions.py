"""Requests that passed validation but could never be admitted stalled the whole engine ("scheduler made no
progress"). Each test failed before its fix."""

from __future__ import annotations

import pytest

from roseinfer import LLM, SamplingParams


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def make(llama_dir: str, **kw) -> LLM:
    return LLM(llama_dir, device="cpu", dtype="float32", block_size=4, **kw)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_preempted_request_comes_back_without_chunked_prefill(
    llama_dir: str, async_scheduling: bool
) -> None:
    """Budget 8, chunking off: a (7-token prompt) joins b, decodes 4 tokens, is preempted, and has 11
    tokens to recompute."""
    llm = make(
        llama_dir,
        num_kv_blocks=5,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        max_num_batched_tokens=8,
        async_scheduling=async_scheduling,
    )
    eng = llm.engine
    eng.add_request(list(range(20, 24)), greedy(12), request_id="b")
    eng.step()
    eng.add_request(list(range(10, 17)), greedy(8), request_id="a")
    done = {}
    for _ in range(100):
        if not eng.has_unfinished_requests():
            break
        for out in eng.step(final_only=True):
            done[out.request_id] = out
    assert eng.core.scheduler.num_preemptions >= 1
    assert sorted(done) == ["a", "b"]
    assert [len(done[r].outputs[0].token_ids) for r in "ab"] == [8, 12]
    assert eng.core.kv.num_free_blocks == 5


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_same_prompt_runs_again_when_its_cached_blocks_fill_the_pool(
    llama_dir: str, async_scheduling: bool
) -> None:
    llm = make(llama_dir, num_kv_blocks=2, async_scheduling=async_scheduling)
    prompt = [20, 21, 22, 23, 24]  # + 3 tokens: both blocks, one full and one partial, stay cached
    first = llm.generate([prompt], greedy(3), use_tqdm=False)[0].outputs[0].token_ids
    second = llm.generate([prompt], greedy(3), use_tqdm=False)[0].outputs[0].token_ids
    assert second == first
    assert llm.engine.core.kv.num_free_blocks == 2


def test_a_request_that_pinned_blocks_leave_no_room_for_is_refused_alone(llama_dir: str) -> None:
    """4 blocks of 4 tokens, 3 of them pinned: 5 prompt tokens + 3 need 2 blocks, and only one is free."""
    llm = make(llama_dir, pinned_prefixes=[list(range(100, 112))], num_kv_blocks=4)
    assert llm.pinned_tokens == [12]
    with pytest.raises(ValueError, match="pinned prefixes leave it") as info:
        llm.generate([[5, 6, 7, 8, 9], [5]], greedy(3), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in info.value.outputs if o is not None] == [3]
    # A request that reads the pinned prefix shares its blocks, and fits.
    out = llm.generate([list(range(100, 112)) + [7]], greedy(3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_request_that_fills_the_pool_finishes_under_a_one_token_budget(
    llama_dir: str, async_scheduling: bool
) -> None:
    """It preempted itself on each write into its own registered partial prompt block, and looped."""
    prompt = [20, 21, 22, 23, 24]
    want = make(llama_dir, enable_prefix_caching=False).generate([prompt], greedy(3), use_tqdm=False)
    llm = make(llama_dir, num_kv_blocks=2, max_num_batched_tokens=1, async_scheduling=async_scheduling)
    eng = llm.engine
    eng.add_request(prompt, greedy(3), request_id="a")
    done = []
    for _ in range(50):
        if not eng.has_unfinished_requests():
            break
        done += eng.step(final_only=True)
    assert not eng.has_unfinished_requests(), "no finish after 50 steps"
    assert done[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    assert eng.core.scheduler.num_preemptions == 0
    assert eng.core.kv.num_free_blocks == 2


def test_max_tokens_none_is_capped_by_the_blocks_pinned_prefixes_leave(llama_dir: str) -> None:
    """4 blocks of 4 tokens, 3 of them pinned: max_tokens=None resolved to the whole pool (16 - 2 tokens), and
    the request was refused as never fitting, instead of running to the one block left to it."""
    llm = make(llama_dir, pinned_prefixes=[list(range(100, 112))], num_kv_blocks=4)
    none = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    out = llm.generate([[5, 6]], none, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 4 - 2 and out.finish_reason == "length"
    # A prompt that reads the pinned prefix shares its three blocks: the whole pool is open to it.
    out = llm.generate([list(range(100, 112)) + [7]], none, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 16 - 13
