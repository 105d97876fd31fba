"""A core.step() that resolves two steps (the step in flight, then a fork step resolved at once) gives a
decoding request two tokens: LLMEngine must detokenize both, in order (it once decoded the later one
twice and lost the earlier)."""

from __future__ import annotations

from roseinfer import LLM, SamplingParams


def make(path: str, async_scheduling: bool) -> LLM:
    return LLM(
        path,
        device="cpu",
        dtype="float32",
        block_size=4,
        cpu_kv_tokens=2048,
        max_num_batched_tokens=4,  # the n=2 prompt prefills in chunks while the other request decodes
        async_scheduling=async_scheduling,
    )


def run(llm: LLM):
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, n=2),
    ]
    prompts = [[5], list(range(20, 34))]
    return llm.generate(prompts, params, use_tqdm=False)


def test_text_matches_token_ids_with_a_fork_step_beside_decodes(model_with_tokenizer):
    sync, fast = make(model_with_tokenizer, False), make(model_with_tokenizer, True)
    want = run(sync)[0].outputs[0]
    got = run(fast)[0].outputs[0]
    assert got.token_ids == want.token_ids
    tok = fast.tokenizer
    assert want.text == tok.decode(want.token_ids)
    assert got.text == want.text, (got.text, want.text)
