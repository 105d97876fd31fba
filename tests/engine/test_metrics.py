"""`LLM.get_metrics()` (`roseinfer/metrics.py`): vLLM v1's shape (Counter / Gauge, each a name, labels and a value),
each value checked against what the engine's outputs say independently: tokens returned, finish reasons,
`num_cached_tokens`, and the scheduler's own queues and preemptions mid-run."""

from __future__ import annotations

import pytest

from roseinfer import LLM, SamplingParams
from roseinfer.metrics import Counter, Gauge
from roseinfer.request import RequestStatus

PROMPTS = [list(range(3, 3 + 13)), list(range(40, 40 + 21)), list(range(7, 7 + 9))]


def values(llm: LLM) -> dict[tuple[str, str], float]:
    """name (and finished_reason, where labelled) -> value."""
    return {
        (m.name.removeprefix("roseinfer:"), m.labels.get("finished_reason", "")): m.value
        for m in llm.get_metrics()
    }


def make(model_dir: str, **kwargs) -> LLM:
    return LLM(model_dir, device="cpu", block_size=4, **{"cpu_kv_tokens": 1024, **kwargs})


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def test_a_fresh_engine_lists_every_metric_at_zero(llama_dir):
    metrics = make(llama_dir).get_metrics()
    assert [(type(m), m.name, m.labels) for m in metrics] == [
        (Gauge, "roseinfer:num_requests_running", {}),
        (Gauge, "roseinfer:num_requests_waiting", {}),
        (Gauge, "roseinfer:kv_cache_usage_perc", {}),
        (Counter, "roseinfer:prefix_cache_queries", {}),
        (Counter, "roseinfer:prefix_cache_hits", {}),
        (Counter, "roseinfer:num_preemptions", {}),
        (Counter, "roseinfer:prompt_tokens", {}),
        (Counter, "roseinfer:generation_tokens", {}),
        (Counter, "roseinfer:request_success", {"finished_reason": "stop"}),
        (Counter, "roseinfer:request_success", {"finished_reason": "length"}),
        (Counter, "roseinfer:request_success", {"finished_reason": "abort"}),
    ]
    assert all(m.value == 0 for m in metrics)


def test_counters_match_what_the_outputs_say(llama_dir):
    llm = make(llama_dir)
    first = llm.generate(PROMPTS, greedy(6, n=2), use_tqdm=False)
    # The first prompt again, told to stop at its own first greedy token: one "stop" a sample.
    stop_at = first[0].outputs[0].token_ids[0]
    again = llm.generate([PROMPTS[0]], greedy(6, stop_token_ids=[stop_at]), use_tqdm=False)
    assert again[0].outputs[0].finish_reason == "stop"
    outs = first + again
    got = values(llm)
    assert got["prompt_tokens", ""] == sum(map(len, PROMPTS)) + len(PROMPTS[0])  # n samples share a prompt
    assert (
        got["generation_tokens", ""]
        == sum(len(c.token_ids) for o in outs for c in o.outputs)
        == 3 * 2 * 6 + 1
    )
    assert got["request_success", "length"] == 6 and got["request_success", "stop"] == 1
    assert got["request_success", "abort"] == 0 and got["num_preemptions", ""] == 0
    assert got["prefix_cache_hits", ""] == sum(o.num_cached_tokens for o in outs) > 0
    # Every request is looked up once, at admission (its n samples fork after it): its prompt's tokens.
    assert got["prefix_cache_queries", ""] == sum(len(o.prompt_token_ids) for o in outs)
    # Idle: nothing queued, and blocks only the cache keeps count as free.
    assert (
        got["num_requests_running", ""],
        got["num_requests_waiting", ""],
        got["kv_cache_usage_perc", ""],
    ) == (0, 0, 0)


def test_gauges_read_the_engine_mid_run_and_aborts_count(llama_dir):
    llm = make(llama_dir, max_num_seqs=2, enable_prefix_caching=False)
    engine = llm.engine
    prompts = [*PROMPTS, list(range(60, 60 + 5))]  # one more waiting than running: the two gauges differ
    rids = [engine.add_request(p, greedy(8, n=2 if i == 0 else 1)) for i, p in enumerate(prompts)]
    engine.step()
    got = values(llm)
    scheduler, kv = engine.core.scheduler, engine.core.kv
    assert got["num_requests_running", ""] == len(scheduler.running) == 2  # max_num_seqs
    assert got["num_requests_waiting", ""] == len(scheduler.waiting) == len(prompts) - 1
    held = kv.num_blocks - kv.num_free_blocks
    assert held > 0 and got["kv_cache_usage_perc", ""] == pytest.approx(held / kv.num_blocks)
    engine.abort_request(rids)
    while engine.has_unfinished_requests():
        engine.step()
    got = values(llm)
    # Every sample: two of the first request, one each of the rest.
    assert got["request_success", "abort"] == len(prompts) + 1
    assert got["request_success", "length"] + got["request_success", "stop"] == 0


def test_preemptions_count(llama_dir):
    llm = make(llama_dir, cpu_kv_tokens=48, enable_prefix_caching=False)
    llm.generate(PROMPTS, greedy(16), use_tqdm=False)
    got = values(llm)
    assert got["num_preemptions", ""] == llm.engine.core.scheduler.num_preemptions > 0
    assert got["request_success", "length"] == len(PROMPTS)


def test_aborting_a_group_counts_only_the_samples_still_running(llama_dir):
    """A sample that already finished keeps its reason when its request is aborted (`Scheduler.finish` is
    idempotent): only the sample still running counts as an abort."""
    llm = make(llama_dir, enable_prefix_caching=False)
    engine = llm.engine
    rid = engine.add_request(PROMPTS[1], greedy(8, n=2))
    while len(engine.groups[rid].seqs) < 2:
        engine.step()
    first, second = (seq.req for seq in engine.groups[rid].seqs)
    engine.core.finish(first, RequestStatus.FINISHED_STOPPED)  # as a stop string found in its text does
    engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    got = values(llm)
    assert (first.status, second.status) == (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_ABORTED)
    assert (got["request_success", "stop"], got["request_success", "abort"]) == (1, 1)


def test_a_stop_string_completed_by_the_last_token_counts_as_stop(model_with_tokenizer):
    """A stop string whose text ends in the token that also reaches max_tokens: the output says "stop" (as vLLM's,
    whose stop strings are checked after the engine core finished the request for length), and so must
    request_success, which counts finished requests by the reason their outputs give."""
    llm = make(model_with_tokenizer)
    prompt, k = "hello world", 3
    text = llm.generate([prompt], greedy(k), use_tqdm=False)[0].outputs[0].text
    shorter = llm.generate([prompt], greedy(k - 1), use_tqdm=False)[0].outputs[0].text
    assert text.startswith(shorter) and len(text) > len(shorter)  # the k-th token completes `text`
    outs = [llm.generate([prompt], greedy(k, stop=[text]), use_tqdm=False)[0] for _ in range(2)]
    assert [(o.outputs[0].finish_reason, o.outputs[0].text) for o in outs] == [("stop", "")] * 2
    got = values(llm)
    assert (got["request_success", "length"], got["request_success", "stop"]) == (2, 2)


def test_a_preempted_requests_recompute_is_not_a_prefix_cache_query(llama_dir):
    """As vLLM's (whose `PrefixCacheStats` keeps a preempted request's re-admission apart): the prefix-cache
    counters count each request's first admission only, so they still add up to the prompts and to the outputs'
    `num_cached_tokens` when preemption recomputes requests over blocks the cache still holds."""
    llm = make(llama_dir, cpu_kv_tokens=48)
    outs = llm.generate(PROMPTS, greedy(16), use_tqdm=False)
    got = values(llm)
    assert got["num_preemptions", ""] > 0
    assert got["prefix_cache_queries", ""] == sum(len(o.prompt_token_ids) for o in outs)
    assert got["prefix_cache_hits", ""] == sum(o.num_cached_tokens for o in outs)
