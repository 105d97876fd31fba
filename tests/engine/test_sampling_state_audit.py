"""Mutation audit (runner/sampling_state.py): sample i of a seeded n > 1 request draws from its own generator,
seeded from (seed, i), sample 0 from the seed itself: so sample 0 draws what the same request with n = 1 draws,
and no sample's draws move another's."""

from __future__ import annotations

from roseinfer import LLM, SamplingParams

PROMPT = [[11, 12, 13, 14, 15]]


def make(llama_dir: str) -> LLM:
    return LLM(llama_dir, device="cpu", dtype="float32", block_size=4, cpu_kv_tokens=2048)


def samples(llm: LLM, **kw) -> list[list[int]]:
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=7, **kw)
    return [c.token_ids for c in llm.generate(PROMPT, params, use_tqdm=False)[0].outputs]


def test_sample_zero_of_a_seeded_fork_draws_as_the_request_alone(llama_dir):
    llm = make(llama_dir)
    (alone,) = samples(llm)
    forked = samples(llm, n=3)
    assert forked[0] == alone
    assert len({tuple(s) for s in forked}) == 3  # each sample its own stream
    assert samples(make(llama_dir), n=3) == forked  # and the same on a fresh engine
    assert samples(llm, n=2) == forked[:2]  # sample i draws the same whatever n is
