"""Offline generate: order, text, stop conditions, seeds, chat templates."""

from __future__ import annotations

from roseinfer import SamplingParams
from roseinfer.tokenizer import apply_chat_template


def test_outputs_in_input_order_with_text(llm):
    prompts = ["The quick brown fox", [7, 8, 9], "你好，世界", "x" * 50]
    outs = llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False
    )
    tok = llm.tokenizer
    for prompt, out in zip(prompts, outs):
        want_ids = tok.encode(prompt) if isinstance(prompt, str) else prompt
        assert out.prompt_token_ids == want_ids
        assert out.prompt == (prompt if isinstance(prompt, str) else None)
        comp = out.outputs[0]
        assert len(comp.token_ids) == 12 and comp.finish_reason == "length"
        assert comp.text == tok.decode(comp.token_ids, skip_special_tokens=True)


def test_same_seed_same_output_regardless_of_batch(llm):
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    alone = llm.generate(["tell me a story"], p, use_tqdm=False)[0].outputs[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    batch = llm.generate(["tell me a story", "noise", [3, 4]], [p, other, other], use_tqdm=False)
    assert batch[0].outputs[0].token_ids == alone
    different = SamplingParams(temperature=1.0, top_p=0.9, seed=99, max_tokens=16, ignore_eos=True)
    assert llm.generate(["tell me a story"], different, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_row_settings_follow_the_batch_as_it_changes(llm):
    """The runner reuses a step's sampling settings while the batch keeps its rows and rebuilds them when
    rows leave: a seeded request keeps its draws and a greedy one stays greedy as others finish."""
    seeded = SamplingParams(temperature=1.0, seed=7, max_tokens=14, ignore_eos=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    short = SamplingParams(temperature=1.5, top_k=3, max_tokens=3, ignore_eos=True)

    def ids(prompts, params):
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    alone = ids(["once upon a time"], seeded) + ids([[21, 22, 23]], greedy)
    mixed = ids(["once upon a time", "x y z", [21, 22, 23], [5, 6]], [seeded, short, greedy, short])
    assert [mixed[0], mixed[2]] == alone


def test_stop_token_ids_and_eos(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    ids = llm.generate([[10, 11, 12]], greedy, use_tqdm=False)[0].outputs[0].token_ids
    stop_at = ids[5]
    first = ids.index(stop_at)
    out = llm.generate(
        [[10, 11, 12]],
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=[stop_at]),
        use_tqdm=False,
    )[0]
    assert out.outputs[0].token_ids == ids[: first + 1] and out.outputs[0].finish_reason == "stop"
    # The model's eos id (0 here) ends a request unless ignore_eos is set.
    engine = llm.engine
    eos = engine.model_config.eos_token_ids
    assert eos == (0,)
    out = llm.generate(
        [[10, 11, 12]], SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[]), use_tqdm=False
    )[0]
    if 0 in ids:
        assert out.outputs[0].token_ids == ids[: ids.index(0) + 1] and out.outputs[0].finish_reason == "stop"
    else:
        assert out.outputs[0].token_ids == ids


def test_stop_string_is_trimmed(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    full = llm.generate(["Hello world"], greedy, use_tqdm=False)[0].outputs[0]
    text = full.text
    assert len(text) >= 6, text
    stop = text[3:6]
    cut = text.index(stop)
    out = llm.generate(
        ["Hello world"],
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop]),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.finish_reason == "stop"
    assert out.text == text[:cut]
    assert len(out.token_ids) < len(full.token_ids) or cut + len(stop) >= len(text)
    assert llm.engine.core.kv.num_free_blocks == llm.engine.core.kv.num_blocks


def test_chat_template_prompt(llm):
    ids = apply_chat_template(llm.tokenizer, [{"role": "user", "content": "hi there"}])
    out = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True), use_tqdm=False)[
        0
    ]
    assert out.prompt_token_ids == ids and len(out.outputs[0].token_ids) == 5


def test_metrics_carry_arrival_first_token_and_finish_times(llm):
    out = llm.generate(
        [[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), use_tqdm=False
    )[0]
    m = out.metrics
    assert m.arrival_time <= m.first_token_time <= m.finished_time


def test_chat_renders_the_template(llm):
    messages = [{"role": "user", "content": "hi there"}]
    out = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), use_tqdm=False)[
        0
    ]
    assert out.prompt_token_ids == apply_chat_template(llm.tokenizer, messages)
    assert len(out.outputs[0].token_ids) == 3
