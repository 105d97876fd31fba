"""Steps with prefill work replay the mixed-step graphs: the same tokens as eager, sync and async, beside
the decode graphs; steps a graph cannot hold run eagerly. On the CPU with stand-in replays that run the
graphs' own body on their buffers (tests/engine/cpu_graph_replay.py)."""

from __future__ import annotations

import numpy as np
import pytest

from roseinfer import LLM, SamplingParams
from roseinfer.config import EngineConfig, ModelConfig
from roseinfer.models.loader import BUILTIN_CONFIG_DIR, builtin_shapes
from roseinfer.runner.inputs import HostStep
from roseinfer.runner.mixed_graphs import AUTO_MAX_TOKENS, auto_mixed_graph_max_tokens, mixed_graph_sizes
from tests.engine.cpu_graph_replay import cpu_decode_graphs, cpu_mixed_graphs
from tests.engine.test_async_scheduling import PROMPTS, assert_clean, greedy, make, token_ids


def with_graphs(llm: LLM, max_tokens: int, decode_graphs: bool = True, **kwargs) -> dict:
    runner = llm.engine.core.runner
    if decode_graphs:
        runner.graphs, _ = cpu_decode_graphs(runner, 8)
    runner.mixed_graphs, replays = cpu_mixed_graphs(runner, max_tokens, **kwargs)
    return replays


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("budget", [5, 16, 24])
def test_mixed_graphs_give_eager_tokens(llama_dir, async_scheduling, budget):
    params = greedy(12)
    want = token_ids(
        make(llama_dir, False, max_num_batched_tokens=budget).generate(PROMPTS, params, use_tqdm=False)
    )
    llm = make(llama_dir, async_scheduling, max_num_batched_tokens=budget)
    replays = with_graphs(llm, 20)
    assert token_ids(llm.generate(PROMPTS, params, use_tqdm=False)) == want
    paths = llm.engine.core.runner.step_paths
    assert paths["mixed_graph"] > 0 and paths["decode_graph"] > 0
    assert sum(r.replays for r in replays.values()) == paths["mixed_graph"]
    if budget == 24:  # the first step (24 tokens after prefix hits) is larger than any graph
        assert paths["eager"] > 0
    assert_clean(llm)


def test_graphs_serve_decodes_longest_first(llama_dir):
    """Both kinds of graph get the decode kernel's rows longest first (each replay checks its buffer), and
    the order is not always row order (prompts of different lengths)."""
    llm = make(llama_dir, True, max_num_batched_tokens=16)
    runner = llm.engine.core.runner
    runner.graphs, decode_replays = cpu_decode_graphs(runner, 8)
    mixed_replays = with_graphs(llm, 20, decode_graphs=False)
    prompts = [p * (1 + i % 3) for i, p in enumerate(PROMPTS)]
    llm.generate(prompts, greedy(10), use_tqdm=False)
    assert sum(r.reordered for r in decode_replays.values()) > 0
    assert sum(r.reordered for r in mixed_replays.values()) > 0
    assert_clean(llm)


def test_mixed_graphs_alone_and_with_sampling_outside(llama_dir):
    """Without decode graphs every step with prefill work, and the pending ids it feeds from eagerly sampled
    steps; seeded and n > 1 rows are sampled outside the graph as in eager."""
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=i, n=1 + i % 3) for i in range(len(PROMPTS))]
    want = token_ids(
        make(llama_dir, True, max_num_batched_tokens=7).generate(PROMPTS, params, use_tqdm=False)
    )
    llm = make(llama_dir, True, max_num_batched_tokens=7)
    with_graphs(llm, 16, decode_graphs=False)
    assert token_ids(llm.generate(PROMPTS, params, use_tqdm=False)) == want
    assert llm.engine.core.runner.step_paths["mixed_graph"] > 0
    assert_clean(llm)


def test_prefix_hits_and_preemption_in_mixed_graphs(llama_dir):
    shared = [[5, 6, 7, 8, 9, 10, 11, 12, 13] + p for p in PROMPTS]
    kw = dict(cpu_kv_tokens=96, max_num_batched_tokens=12)
    want = token_ids(make(llama_dir, False, **kw).generate(shared, greedy(24), use_tqdm=False))
    llm = make(llama_dir, True, **kw)
    with_graphs(llm, 16)
    assert token_ids(llm.generate(shared, greedy(24), use_tqdm=False)) == want
    assert llm.engine.core.scheduler.num_preemptions > 0
    assert llm.engine.core.runner.step_paths["mixed_graph"] > 0
    assert_clean(llm)


def _step(q_lens: list[int], width: int = 2) -> HostStep:
    i32 = np.int32
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(i32)
    t, b = int(qsl[-1]), len(q_lens)
    return HostStep(
        input_ids=np.zeros(t, i32),
        positions=np.zeros(t, i32),
        slot_mapping=np.zeros(t, i32),
        query_start_loc=qsl,
        seq_lens=np.array(q_lens, i32),
        block_tables=np.zeros((b, width), i32),
        max_query_len=max(q_lens),
        logits_index=(qsl[1:] - 1).astype(i32),
    )


def test_plan_sends_what_a_graph_cannot_hold_to_eager(llama_dir):
    llm = make(llama_dir, True, max_num_seqs=4)
    runner = llm.engine.core.runner
    graphs, _ = cpu_mixed_graphs(runner, 32, max_chunks=2)
    assert graphs.sizes == [16, 32]
    assert graphs.plan(_step([1, 1, 5])).size == 16
    assert graphs.plan(_step([1, 9, 9])).size == 32  # 19 tokens: the next size up
    assert graphs.plan(_step([1, 1])) is None  # decode only: the decode graphs' step
    assert graphs.plan(_step([30, 3])) is None  # 33 tokens
    assert graphs.plan(_step([1, 1, 1, 1, 2])) is None  # 5 sequences
    # 16 tokens hold one 16-row q tile, plus one per chunk for two chunks: 4 chunks need 4 tiles
    assert graphs.plan(_step([2, 2, 2, 2])) is None
    assert graphs.plan(_step([2, 2, 2])).size == 16
    assert graphs.plan(_step([3, 2], width=runner.max_blocks_per_seq + 1)) is None


def test_graph_sizes_and_config():
    assert mixed_graph_sizes(0) == []
    assert mixed_graph_sizes(100) == [16, 32, 48, 64, 96, 100]
    sizes = mixed_graph_sizes(8192)
    assert sizes == sorted(set(sizes)) and sizes[-1] == 8192
    with pytest.raises(ValueError, match="mixed_graph_max_tokens"):
        EngineConfig.__post_init__(type("C", (), {"mixed_graph_max_tokens": -1, "max_logprobs": 20})())


def test_automatic_cap_follows_the_layer_size():
    """The cap is where a step's GEMMs take the GPU as long as its eager launch takes the host: large for
    small layers (host-bound prefill), the floor for 8B layers, and never growing with the layer."""
    caps = {}
    for name in builtin_shapes():
        cfg = ModelConfig.from_path(f"{BUILTIN_CONFIG_DIR}/{name}.json")
        caps[name] = (cfg.layer_params(), auto_mixed_graph_max_tokens(cfg))
    assert caps["qwen2.5-0.5b"][1] == 4096 and caps["llama-3.1-8b"][1] == 1024
    assert all(AUTO_MAX_TOKENS[0] <= cap <= AUTO_MAX_TOKENS[1] for _, cap in caps.values())
    by_size = [cap for _, cap in sorted(caps.values())]
    assert by_size == sorted(by_size, reverse=True)
    # Between the bounds the cap is inversely proportional to the layer's parameters.
    cfg = ModelConfig.from_path(f"{BUILTIN_CONFIG_DIR}/llama-3.1-8b.json")
    mid = [
        ModelConfig.from_dict({**cfg.hf_config, "hidden_size": 2048, "intermediate_size": inter})
        for inter in (4096, 8192)
    ]
    (p1, c1), (p2, c2) = [(m.layer_params(), auto_mixed_graph_max_tokens(m)) for m in mid]
    assert AUTO_MAX_TOKENS[0] < c2 < c1 < AUTO_MAX_TOKENS[1]
    assert c1 * p1 == pytest.approx(c2 * p2, rel=1e-3)


@pytest.mark.parametrize(
    ("cap", "budget", "want"), [(None, 16384, 4096), (None, 100, 100), (0, 16384, 0), (300, 16384, 300)]
)
def test_runner_resolves_the_cap(llama_dir, cap, budget, want):
    """Unset, the cap comes from the model (the tiny test model's layers are small: the upper bound), and
    no step larger than the token budget needs a graph."""
    llm = make(llama_dir, True, max_num_batched_tokens=budget, mixed_graph_max_tokens=cap)
    assert llm.engine.core.runner.mixed_graph_max_tokens == want
