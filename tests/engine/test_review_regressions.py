"""Regression tests for the review findings: each one failed before its fix."""

from __future__ import annotations

import pytest

from roseinfer import LLM, SamplingParams
from roseinfer.config import SchedulerConfig
from roseinfer.kv.manager import KVCacheManager
from roseinfer.request import Request, RequestStatus
from roseinfer.runner.inputs import build_host_step
from roseinfer.scheduler.scheduler import ScheduledRequest, Scheduler, SchedulerOutput
from tests.engine.cpu_graph_replay import cpu_decode_graphs


def make(llama_dir: str, **kw) -> LLM:
    kw.setdefault("cpu_kv_tokens", 2048)
    return LLM(llama_dir, device="cpu", dtype="float32", block_size=4, **kw)


def greedy(n_tokens: int = 8, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True, **kw)


def ids(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def test_one_token_prompt_chunks_next_to_decodes(llama_dir):
    prompts = [[11, 12, 13, 14, 15, 16, 17], [40, 41], [50, 51, 52, 53, 54]]
    want = ids(make(llama_dir).generate(prompts, greedy(), use_tqdm=False))
    for budget in (1, 3):  # budget 3 with 2 decodes leaves a 1-token chunk for the third prompt
        got = ids(make(llama_dir, max_num_batched_tokens=budget).generate(prompts, greedy(), use_tqdm=False))
        assert got == want, f"budget {budget}"


def test_graph_path_gathers_rows_when_counts_happen_to_match(llama_dir):
    """One row that does not sample + one n=2 row: 2 sample rows for 2 sequences, but not rows 0 and 1."""
    llm = make(llama_dir)
    runner, kv = llm.engine.core.runner, llm.engine.core.kv

    graphs, _ = cpu_decode_graphs(runner, 4)

    a = Request("A", [30, 31, 32, 33, 34, 35], greedy(4))
    b = Request("B", [40, 41, 42, 43, 44], greedy(4, n=2))
    for r, done in ((a, 2), (b, 4)):
        assert kv.allocate_slots(r, r.num_tokens)
        r.num_computed_tokens = done
        r.status = RequestStatus.RUNNING
    out = SchedulerOutput([ScheduledRequest(a, 1, 0, start=2), ScheduledRequest(b, 1, 2, start=4)])
    eager = runner.execute(out)
    assert [len(t) for t in eager] == [0, 2]
    runner.graphs = graphs
    assert graphs.can_run(build_host_step(out, runner.block_size))
    assert runner.execute(out) == eager


def test_admission_policy_reaches_the_scheduler(llama_dir):
    assert make(llama_dir, admission_policy="lpm").engine.core.scheduler.policy.name == "lpm"


def test_prompt_longer_than_the_step_budget_without_chunking(llama_dir):
    llm = make(llama_dir, enable_chunked_prefill=False, max_num_batched_tokens=16)
    with pytest.raises(
        ValueError, match="with chunked prefill off a prompt must fit one step's budget of 16"
    ):
        llm.engine.add_request(list(range(3, 30)), greedy())
    assert ids(llm.generate([[5, 6, 7]], greedy(3), use_tqdm=False))[0] != []


def test_request_that_fills_the_pool_exactly(llama_dir):
    """Its own cached partial block must be copied before its first decode: it preempts itself once,
    re-enters at once and finishes, with the output it has with the cache off."""
    prompt = [20, 21, 22, 23, 24]
    want = ids(
        make(llama_dir, num_kv_blocks=2, enable_prefix_caching=False).generate(
            [prompt], greedy(3), use_tqdm=False
        )
    )
    on = make(llama_dir, num_kv_blocks=2)
    assert ids(on.generate([prompt], greedy(3), use_tqdm=False)) == want
    assert on.engine.core.kv.num_free_blocks == 2


def test_user_ids_cannot_touch_another_requests_generator(llama_dir):
    def run(reqs):
        engine = make(llama_dir).engine
        for rid, prompt, p in reqs:
            engine.add_request(prompt, p, request_id=rid)
        res = {}
        while engine.has_unfinished_requests():
            for o in engine.step(final_only=True):
                res[o.request_id] = [c.token_ids for c in o.outputs]
        return res

    mine = ("a#1", [50, 51, 52], SamplingParams(temperature=1.0, seed=7, max_tokens=8, ignore_eos=True))
    other = SamplingParams(temperature=1.0, seed=100, max_tokens=8, ignore_eos=True, n=2)
    alone = run([mine])["a#1"]
    assert run([("a", [60, 61], other), mine])["a#1"] == alone
    assert run([("b", [60, 61], other), mine])["a#1"] == alone


def test_static_batch_never_over_commits():
    kv = KVCacheManager(10, 4, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(8, 16, "static"), kv, 1000)
    for i in range(3):  # 3 prompts of 4 blocks each; the pool has 10
        sched.add_request(Request(str(i), list(range(100 * i, 100 * i + 16)), SamplingParams(max_tokens=4)))
    while sched.has_unfinished():
        out = sched.schedule()
        assert not out.preempted
        sched.update_from_output(out, [[1] * s.num_samples for s in out.scheduled])
    assert sched.num_preemptions == 0


def test_numpy_token_ids_are_accepted(llama_dir):
    import numpy as np

    out = make(llama_dir).generate(
        [np.array([5, 6, 7]).tolist(), list(np.array([5, 6, 7]))], greedy(3), use_tqdm=False
    )
    assert ids(out)[0] == ids(out)[1]
