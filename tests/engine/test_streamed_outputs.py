"""What a caller streaming `LLMEngine.step()` outputs sees, beyond tests/engine/test_api_contract.py: the text held
back for stop strings, the stop string found in the last token max_tokens allows, times and prompt ids that
later outputs keep."""

from __future__ import annotations

from roseinfer import LLM, RequestOutput, SamplingParams
from tests.engine.test_api_contract import greedy

PROMPT = [5, 6, 7]


def stream(llm: LLM, params: SamplingParams, prompt: list[int] = PROMPT) -> list[RequestOutput]:
    engine = llm.engine
    rid = engine.add_request(prompt, params)
    outs: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == rid]
    return outs


def test_streamed_text_holds_back_one_character_less_than_the_longest_stop_string(llm: LLM) -> None:
    """As vLLM: what could still begin a stop string (its length less one characters) is held back while the
    sequence runs; once it finishes, the whole text shows."""
    free = {len(o.outputs[0].token_ids): o.outputs[0].text for o in stream(llm, greedy(16, ignore_eos=True))}
    stop = "\u2603\u2603\u2603"  # never generated: three snowmen
    held = stream(llm, greedy(16, ignore_eos=True, stop=["\u2603", stop]))
    assert held[-1].finished and held[-1].outputs[0].text == free[16]
    assert any(len(free[len(o.outputs[0].token_ids)]) > 2 for o in held[:-1])
    for o in held[:-1]:
        full = free[len(o.outputs[0].token_ids)]
        assert o.outputs[0].text == full[: max(len(full) - (len(stop) - 1), 0)]


def test_a_stop_string_in_the_last_token_max_tokens_allows_is_a_stop(llm: LLM) -> None:
    """As vLLM: a stop string found in the text of the token that also reaches max_tokens ends the sequence as
    "stop", naming the string, with the string cut from the text."""
    run = llm.generate([PROMPT], greedy(16, ignore_eos=True), use_tqdm=False)[0].outputs[0].token_ids
    decode = llm.tokenizer.decode
    # A length whose last token adds whole characters (the tiny random model also emits broken UTF-8).
    n = next(
        n
        for n in range(16, 1, -1)
        if "\ufffd" not in decode(run[:n]) and len(decode(run[:n])) > len(decode(run[: n - 1]))
    )
    base = llm.generate([PROMPT], greedy(n, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    text, ids = base.text, base.token_ids
    assert text == decode(ids)
    # The shortest suffix found nowhere earlier in the text: it completes only with the last token.
    stop = next(text[i:] for i in range(len(text) - 1, -1, -1) if text.find(text[i:]) == i)
    got = llm.generate([PROMPT], greedy(n, ignore_eos=True, stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert got.token_ids == ids
    assert (got.finish_reason, got.stop_reason) == ("stop", stop)
    assert got.text == text[: len(text) - len(stop)]


def test_first_token_time_is_the_first_tokens(llm: LLM) -> None:
    outs = stream(llm, greedy(6, ignore_eos=True))
    first = outs[0].metrics.first_token_time
    assert first is not None and all(o.metrics.first_token_time == first for o in outs)
    assert outs[-1].metrics.finished_time >= first


def test_an_output_s_prompt_ids_are_the_caller_s_to_change(llm: LLM) -> None:
    """A caller editing a streamed output's prompt_token_ids changes neither the tokens nor the request."""
    want = llm.generate([PROMPT], greedy(6, ignore_eos=True), use_tqdm=False)[0].outputs[0].token_ids
    engine = llm.engine
    rid = engine.add_request(list(PROMPT), greedy(6, ignore_eos=True))
    req = engine.groups[rid].root
    outs: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id == rid:
                outs.append(o)
                o.prompt_token_ids.append(99)
    assert len(outs) > 1 and outs[-1].prompt_token_ids == [*PROMPT] + [99] * len(outs)  # one list, shared
    assert req.prompt_token_ids == PROMPT
    assert outs[-1].outputs[0].token_ids == want


def test_a_running_sequence_has_no_finish_reason(llm: LLM) -> None:
    outs = stream(llm, greedy(5, ignore_eos=True))
    assert len(outs) > 1
    assert all(not o.finished and o.outputs[0].finish_reason is None for o in outs[:-1])
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"
