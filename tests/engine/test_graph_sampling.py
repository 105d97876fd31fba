"""Decode graphs sample inside the replay: greedy and plain-temperature rows take their tokens from the
graph, each row with its own temperature; seeded, top-k/top-p/min-p and gathered rows are sampled outside.
Run on the CPU with stand-in replays that execute the graphs' own body (tests/engine/cpu_graph_replay.py)."""

from __future__ import annotations

import pytest

import roseinfer.runner.cuda_graphs as cuda_graphs
import roseinfer.runner.model_runner as model_runner
from roseinfer import LLM, SamplingParams
from roseinfer.request import Request, RequestStatus
from roseinfer.runner.inputs import build_host_step
from roseinfer.scheduler.scheduler import ScheduledRequest, SchedulerOutput
from tests.engine.cpu_graph_replay import cpu_decode_graphs

PROMPTS = [[11 + i for i in range(n)] for n in (1, 3, 4, 5, 9, 17, 30)]


def make(llama_dir: str, graphs: bool, **kw) -> LLM:
    llm = LLM(llama_dir, device="cpu", dtype="float32", block_size=4, cpu_kv_tokens=2048, **kw)
    if graphs:
        runner = llm.engine.core.runner
        runner.graphs, _ = cpu_decode_graphs(runner, 8)
    return llm


def params(temperature: float, n_tokens: int = 10, **kw) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_tokens=n_tokens, ignore_eos=True, **kw)


def outputs(llm: LLM, ps) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, ps, use_tqdm=False)]


@pytest.fixture
def sampled_outside(monkeypatch) -> dict[str, int]:
    """Counts graph replays and the steps whose tokens the runner sampled outside a graph."""
    counts = {"graph": 0, "outside": 0}
    real_run, real_sample = cuda_graphs.DecodeGraphs.run, model_runner.sample

    def run(self, *args, **kwargs):
        counts["graph"] += 1
        return real_run(self, *args, **kwargs)

    def sample(*args, **kwargs):
        counts["outside"] += 1
        return real_sample(*args, **kwargs)

    monkeypatch.setattr(cuda_graphs.DecodeGraphs, "run", run)
    monkeypatch.setattr(model_runner, "sample", sample)
    return counts


def test_each_row_gets_its_own_temperature_in_the_graph(llama_dir, sampled_outside):
    want = outputs(make(llama_dir, graphs=False), params(0.0))
    llm = make(llama_dir, graphs=True)
    sampled_outside.update(graph=0, outside=0)
    # Odd rows at a temperature so low that the draw is the argmax: any row given another row's
    # temperature, or none, would still match; the hot rows below catch a temperature that never arrives.
    cold = [params(0.0 if i % 2 == 0 else 1e-6) for i in range(len(PROMPTS))]
    assert outputs(llm, cold) == want
    graphed = sampled_outside["graph"]
    assert graphed > 0 and sampled_outside["outside"] + graphed == llm.engine.core.runner.num_launches
    # Hot rows: the prompt's first token is sampled outside (prefill), so judge the graph's draws by
    # whether each one is the argmax after the row's own prefix. At temperature 50 few should be.
    hot = [params(0.0 if i % 2 == 0 else 50.0) for i in range(len(PROMPTS))]
    got = outputs(llm, hot)
    assert [got[i] for i in range(0, len(PROMPTS), 2)] == [want[i] for i in range(0, len(PROMPTS), 2)]
    prefixes = [PROMPTS[i] + got[i][:k] for i in range(1, len(PROMPTS), 2) for k in range(1, 10)]
    drawn = [got[i][k] for i in range(1, len(PROMPTS), 2) for k in range(1, 10)]
    argmax = [o.outputs[0].token_ids[0] for o in llm.generate(prefixes, params(0.0, 1), use_tqdm=False)]
    assert sum(a == d for a, d in zip(argmax, drawn)) <= len(drawn) // 4


def test_seeded_and_filtered_rows_are_sampled_outside_the_graph(llama_dir, sampled_outside):
    for extra in ({"seed": 7}, {"top_k": 5}, {"top_p": 0.9}, {"min_p": 0.1}):
        ps = [params(0.0)] + [params(0.8, **extra)] * (len(PROMPTS) - 1)
        if "seed" in extra:
            want = outputs(make(llama_dir, graphs=False), ps)
        llm = make(llama_dir, graphs=True)
        sampled_outside.update(graph=0, outside=0)
        got = outputs(llm, ps)
        assert sampled_outside["graph"] > 0
        assert sampled_outside["outside"] == llm.engine.core.runner.num_launches, extra
        if "seed" in extra:
            assert got == want  # a seeded request draws the same tokens with graphs as without


def test_a_fork_sampled_at_temperature_in_a_graph_step(llama_dir):
    """An n = 2 request whose last prompt chunk is one token samples two rows from one input row: the
    graph's tokens do not apply, and the rows' temperatures must not be written as if they did."""
    llm = make(llama_dir, graphs=True)
    runner, kv = llm.engine.core.runner, llm.engine.core.kv
    req = Request("B", [40, 41, 42, 43, 44], params(0.8, 4, n=2))
    assert kv.allocate_slots(req, req.num_tokens)
    req.num_computed_tokens, req.status = 4, RequestStatus.RUNNING
    out = SchedulerOutput([ScheduledRequest(req, 1, 2, start=4)])
    assert runner.graphs.can_run(build_host_step(out, runner.block_size))
    tokens = runner.execute(out)
    assert [len(t) for t in tokens] == [2]
    assert all(0 <= t < runner.cfg.vocab_size for t in tokens[0])
