"""W5's timed stream (`bench/prefix_cow.run_offline_timed`) counts every sample of a request with n > 1: since
the 39th session a streamed output holds the one sample that moved, so keying by request alone would mix them."""

from __future__ import annotations

import numpy as np

from roseinfer.bench.engine_probe import Probe
from roseinfer.bench.prefix_cow import run_offline_timed
from roseinfer.bench.workloads import Workload
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.llm import make_engine_config
from roseinfer.sampling_params import SamplingParams


def test_every_sample_of_n_gt_1_is_counted_once_per_token():
    config, path = make_engine_config("tiny-llama", load_format="dummy", num_kv_blocks=64, seed=0)
    engine = LLMEngine(config, path)
    rng = np.random.default_rng(7)
    n, max_tokens, requests = 3, 4, 2
    prompts = [rng.integers(5, 200, size=int(rng.integers(9, 30))).tolist() for _ in range(requests)]
    params = [
        SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=True, temperature=1.0, seed=i)
        for i in range(requests)
    ]
    workload = Workload("W5", "n > 1 check", prompts, params)
    result = run_offline_timed(engine, workload, Probe(engine))
    assert result.completion_tokens == requests * n * max_tokens
    assert len(result.ttft) == requests  # one first token per request
    assert len(result.itl) == requests * n * (max_tokens - 1)  # ignore_eos: one token a step after the first
    assert not engine.has_unfinished_requests()
