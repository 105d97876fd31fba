"""A stop string in the earlier of two tokens that one core.step() resolves ends the sequence there, and
the later token is dropped, as with synchronous stepping (it was once missed and the request ran on)."""

from __future__ import annotations

from roseinfer import LLM, SamplingParams


def make(path: str, async_scheduling: bool) -> LLM:
    return LLM(
        path,
        device="cpu",
        dtype="float32",
        block_size=4,
        cpu_kv_tokens=2048,
        max_num_batched_tokens=4,
        async_scheduling=async_scheduling,
    )


def run(llm: LLM, stop: list[str] | None):
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=stop),
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, n=2),
    ]
    # Step 1: [5] prefills, the n=2 prompt takes 3 tokens; step 2: [5] decodes (its first token pending),
    # the n=2 prompt ends (a fork step, resolved at once): core.step() applies two tokens of request 0.
    prompts = [[5], list(range(20, 26))]
    return llm.generate(prompts, params, use_tqdm=False)


def test_stop_string_in_the_earlier_of_two_resolved_tokens(model_with_tokenizer):
    sync, fast = make(model_with_tokenizer, False), make(model_with_tokenizer, True)
    free = run(sync, None)[0].outputs[0]
    first = sync.tokenizer.decode(free.token_ids[:1])
    assert first and first not in sync.tokenizer.decode(free.token_ids[1:])
    want = run(sync, [first])[0].outputs[0]
    assert want.finish_reason == "stop" and want.text == "" and len(want.token_ids) == 1
    got = run(fast, [first])[0].outputs[0]
    assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
