"""Async scheduling (step N+1 scheduled and launched before step N's tokens reach the host) gives the same
outputs as the synchronous loop, in every situation that touches a pending token."""

from __future__ import annotations

import pytest

import roseinfer.runner.cuda_graphs as cuda_graphs
import roseinfer.runner.inputs as inputs
from roseinfer import LLM, SamplingParams
from tests.engine.cpu_graph_replay import cpu_decode_graphs


def make(llama_dir: str, async_scheduling: bool, **kw) -> LLM:
    kw.setdefault("cpu_kv_tokens", 2048)
    return LLM(
        llama_dir, device="cpu", dtype="float32", block_size=4, async_scheduling=async_scheduling, **kw
    )


def greedy(n_tokens: int = 10, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True, **kw)


PROMPTS = [[11 + i for i in range(n)] for n in (1, 3, 4, 5, 9, 17, 30)]


def token_ids(outs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outs]


def assert_clean(llm: LLM) -> None:
    core = llm.engine.core
    assert not core.has_unfinished() and core.inflight is None
    core.scheduler.check_invariants()
    assert core.kv.num_free_blocks == core.kv.num_blocks - len(core.kv.pool.pinned)


def compare(llama_dir: str, prompts, params, **kw) -> tuple[LLM, LLM]:
    sync, fast = make(llama_dir, False, **kw), make(llama_dir, True, **kw)
    want = token_ids(sync.generate(prompts, params, use_tqdm=False))
    got = token_ids(fast.generate(prompts, params, use_tqdm=False))
    assert got == want
    assert_clean(sync)
    assert_clean(fast)
    return sync, fast


@pytest.fixture
def fills(monkeypatch) -> list[int]:
    """How many input ids each step took from the device (pending tokens)."""
    counts: list[int] = []
    real = inputs.fill_pending

    def spy(ids, fill_index, fill_row, prev):
        counts.append(fill_index.numel())
        real(ids, fill_index, fill_row, prev)

    real_run = cuda_graphs.DecodeGraphs.run

    def run_spy(self, step, *args):  # graphs fill pending ids inside the replay
        counts.append(len(step.fill_index))
        return real_run(self, step, *args)

    monkeypatch.setattr(inputs, "fill_pending", spy)
    monkeypatch.setattr(cuda_graphs.DecodeGraphs, "run", run_spy)
    return counts


def test_pending_tokens_are_fed_on_the_device(llama_dir, fills):
    compare(llama_dir, PROMPTS, greedy())
    assert sum(fills) > 0  # the async engine fed decodes from the device (the sync one never does)


@pytest.mark.parametrize("budget", [3, 8, 64])
def test_chunked_prefill_beside_pending_decodes(llama_dir, budget):
    compare(llama_dir, PROMPTS, greedy(), max_num_batched_tokens=budget)


def test_preemption_with_tokens_in_flight(llama_dir):
    sync, fast = compare(llama_dir, PROMPTS, greedy(24), cpu_kv_tokens=64, enable_prefix_caching=False)
    assert fast.engine.core.scheduler.num_preemptions > 0


def test_preemption_with_prefix_caching(llama_dir):
    shared = [[5, 6, 7, 8, 9, 10, 11, 12, 13] + p for p in PROMPTS]
    sync, fast = compare(llama_dir, shared, greedy(24), cpu_kv_tokens=96)
    assert fast.engine.core.scheduler.num_preemptions > 0


def test_stop_tokens_drop_the_token_in_flight(llama_dir):
    free_run = token_ids(make(llama_dir, False).generate(PROMPTS, greedy(12), use_tqdm=False))
    stop = free_run[5][0][4]  # a token the 6th prompt generates mid-way
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop])
    sync, fast = compare(llama_dir, PROMPTS, params)
    out = fast.generate(PROMPTS, params, use_tqdm=False)
    assert out[5].outputs[0].token_ids[-1] == stop and out[5].outputs[0].finish_reason == "stop"


def test_n_samples_and_seeds(llama_dir):
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=i, n=1 + i % 3) for i in range(len(PROMPTS))]
    compare(llama_dir, PROMPTS, params)


def test_multi_turn_hits_blocks_registered_after_the_fact(llama_dir):
    """A block whose last token was pending when its step was scheduled is registered once known."""
    for llm in (make(llama_dir, False), make(llama_dir, True)):
        # 9 prompt + 8 output tokens: 16 computed (the last output's KV is never written). The step that
        # computes position 15 is the request's last but one: its input token was pending when scheduled.
        first = llm.generate([PROMPTS[4]], greedy(8), use_tqdm=False)[0]
        turn2 = PROMPTS[4] + first.outputs[0].token_ids + [99, 98]
        llm.turn2 = llm.generate([turn2], greedy(4), use_tqdm=False)[0]
        assert llm.turn2.num_cached_tokens == 16
        assert_clean(llm)


def test_abort_while_a_step_is_in_flight(llama_dir):
    llm = make(llama_dir, True)
    engine = llm.engine
    for i, p in enumerate(PROMPTS):
        engine.add_request(p, greedy(20), request_id=str(i))
    for _ in range(4):
        engine.step()
    assert engine.core.inflight is not None
    engine.abort_request("3")
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert "3" not in finished and len(finished) == len(PROMPTS) - 1
    assert_clean(llm)


def test_graph_path_fills_pending_tokens(llama_dir, fills):
    """DecodeGraphs.run on the CPU (a replay that runs the forward on the graph buffers), async vs sync."""
    want = token_ids(make(llama_dir, False).generate(PROMPTS, greedy(), use_tqdm=False))
    llm = make(llama_dir, True)
    runner = llm.engine.core.runner
    graphs, replays = cpu_decode_graphs(runner, 8)
    runner.graphs = graphs
    assert token_ids(llm.generate(PROMPTS, greedy(), use_tqdm=False)) == want
    assert sum(r.replays for r in replays.values()) > 0 and sum(fills) > 0
    assert_clean(llm)
