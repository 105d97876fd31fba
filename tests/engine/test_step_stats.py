"""`EngineCore.stats` (StepStats), which the benchmarks read (`bench/engine_run.py`): with async scheduling off, a
step with prefill work is booked as prefill time, a pure decode step as decode time; prompt tokens computed and
steps are counted; `reset()` clears everything."""

from __future__ import annotations

from roseinfer import SamplingParams
from tests.engine.test_min_tokens import make


def test_steps_are_booked_by_the_work_they_hold(llama_dir):
    llm = make(llama_dir, async_scheduling=False)
    stats = llm.engine.core.stats
    stats.reset()
    prompt = list(range(10, 19))
    llm.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True), use_tqdm=False)
    # One step, all prefill: nothing booked as decode.
    assert stats.num_steps == 1 and stats.num_prompt_tokens_computed == len(prompt)
    assert stats.prefill_time > 0.0 and stats.decode_time == 0.0 and stats.device_wait_time > 0.0
    prefill_time = stats.prefill_time
    llm.generate([[7, 8, 9, 10, 11]], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    # One more prefill step (5 prompt tokens), then two decode steps.
    assert stats.num_steps == 4 and stats.num_prompt_tokens_computed == len(prompt) + 5
    assert stats.prefill_time > prefill_time and stats.decode_time > 0.0
    stats.reset()
    assert (stats.num_steps, stats.num_prompt_tokens_computed) == (0, 0)
    assert (stats.prefill_time, stats.decode_time, stats.device_wait_time) == (0.0, 0.0, 0.0)
