"""`SamplingParams.bad_words`, as in vLLM v1, end to end on the CPU torch backend with a tokenizer, against the
whole-sequence reference of `logit_reference.py`, async scheduling on and off (where a word's prefix may end
with a token in flight), eager and with CPU graph replays, greedy, seeded and n > 1.

The words are taken from the model's own greedy output (windows of it whose text tokenizes back to them), so
that banning them changes what it generates."""

from __future__ import annotations

from dataclasses import replace

import pytest

from roseinfer import LLM, SamplingParams
from tests.engine.logit_reference import check_greedy, reference_banned
from tests.engine.test_min_tokens import make

PROMPTS = [[40 + 7 * i + j for j in range(3 + i)] for i in range(6)]


def greedy(max_tokens: int = 16, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def word_ids(llm: LLM, words: list[str]) -> list[tuple[int, ...]]:
    """vLLM's tokenization, spelled out: the word stripped, and with one leading space where that is a new
    first token of the same length."""
    tok = llm.engine.tokenizer
    out = []
    for w in words:
        plain = tok.encode(w.lstrip(), add_special_tokens=False)
        spaced = tok.encode(" " + w.lstrip(), add_special_tokens=False)
        out.append(tuple(plain))
        if spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(tuple(spaced))
    return out


def words_from(llm: LLM, tokens: list[int], length: int) -> list[str]:
    """Texts of `length`-token windows of `tokens` (past the first two) that tokenize back to the window."""
    tok = llm.engine.tokenizer
    found = []
    for i in range(2, len(tokens) - length + 1):
        text = tok.decode(tokens[i : i + length])
        if (
            text.strip()
            and text == text.lstrip()
            and tok.encode(text, add_special_tokens=False) == tokens[i : i + length]
        ):
            found.append(text)
    return found


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_greedy_with_bad_words_matches_the_reference(model_with_tokenizer, async_scheduling, graphs):
    llm = make(model_with_tokenizer, async_scheduling, graphs)
    plain = llm.generate(PROMPTS, greedy(), use_tqdm=False)
    multi = 0
    decided = 0
    params = []
    for out in plain:
        tokens = out.outputs[0].token_ids
        words = (words_from(llm, tokens, 2) + words_from(llm, tokens, 3))[:2] or words_from(llm, tokens, 1)[
            :1
        ]
        multi += sum(len(w) > 1 for w in word_ids(llm, words))
        params.append(greedy(bad_words=words) if words else greedy())
    assert multi >= 3  # some words span several tokens: their bans wait on the output
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, out, before, sp in zip(PROMPTS, outs, plain, params):
        ids = word_ids(llm, sp.bad_words or [])
        decided += check_greedy(llm, prompt, out.outputs[0].token_ids, sp, ids)
        if sp.bad_words:
            assert out.outputs[0].token_ids != before.outputs[0].token_ids
            # no word's tokens appear in the output past its start
            toks = out.outputs[0].token_ids
            for i in range(len(toks)):
                assert toks[i] not in reference_banned(ids, toks[:i])
    assert decided > 0
    if graphs:
        paths = llm.engine.core.runner.step_paths
        assert paths["decode_graph"] > 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_bad_words_with_the_other_controls_and_n_samples(model_with_tokenizer, async_scheduling):
    llm = make(model_with_tokenizer, async_scheduling, graphs=True)
    plain = llm.generate(PROMPTS[:3], greedy(12), use_tqdm=False)
    for prompt, before in zip(PROMPTS[:3], plain):
        tokens = before.outputs[0].token_ids
        words = words_from(llm, tokens, 2)[:1] + words_from(llm, tokens, 1)[:1]
        if not words:
            continue
        vocab = llm.engine.model_config.vocab_size
        sp = replace(
            greedy(12, bad_words=words, logit_bias={tokens[0]: -2.0, 9: 1.0}, repetition_penalty=1.3),
            n=2,
            allowed_token_ids=sorted(set(tokens) | {9, vocab - 1}),
        )
        out = llm.generate([prompt], sp, use_tqdm=False)[0]
        first, second = [c.token_ids for c in out.outputs]
        assert first == second
        check_greedy(llm, prompt, first, sp, word_ids(llm, words))


@pytest.mark.parametrize("seed", [None, 5])
def test_sampled_rows_never_complete_a_bad_word_and_seeds_repeat(model_with_tokenizer, seed):
    """Every draw avoids the words' last tokens wherever the output so far ends with the rest; a seeded request
    draws the same with async scheduling on and off, eager and with graphs."""
    words = ["the", "fox", "inference engine", "Hello world", "quick brown", "!"]
    results = []
    for async_scheduling, graphs in [(False, False), (True, False), (True, True)]:
        llm = make(model_with_tokenizer, async_scheduling, graphs)
        ids = word_ids(llm, words)
        sp = SamplingParams(temperature=2.0, seed=seed, n=3, max_tokens=24, ignore_eos=True, bad_words=words)
        got = []
        for out in llm.generate(PROMPTS, sp, use_tqdm=False):
            for c in out.outputs:
                toks = c.token_ids
                assert len(toks) == 24
                assert all(toks[i] not in reference_banned(ids, toks[:i]) for i in range(24)), toks
                got.append(toks)
        results.append(got)
    if seed is not None:
        assert results[0] == results[1] == results[2]


def test_bad_words_need_a_tokenizer_and_tokenize_within_the_vocabulary(llama_dir, model_with_tokenizer):
    with pytest.raises(ValueError, match="bad_words need a tokenizer"):
        make(llama_dir).generate([[1, 2]], greedy(bad_words=["x"]), use_tqdm=False)
    llm = make(model_with_tokenizer)
    req_ids = word_ids(llm, ["fox", "Hello world"])
    llm.engine.add_request([5, 6], greedy(bad_words=["fox", "Hello world"]), request_id="probe")
    req = next(r for r in llm.engine.core.scheduler.waiting if r.request_id == "probe")
    assert list(req.bad_words_token_ids) == req_ids
    llm.engine.abort_request("probe")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_bad_words_hold_across_preemption(model_with_tokenizer, async_scheduling):
    """A KV cache of 16 blocks of 4 tokens preempts requests (recompute): resumed, each still bans by its
    output so far."""
    big = make(model_with_tokenizer, async_scheduling)
    plain = big.generate(PROMPTS, greedy(24), use_tqdm=False)
    params = []
    for out in plain:
        tokens = out.outputs[0].token_ids
        params.append(
            greedy(24, bad_words=(words_from(big, tokens, 2) + words_from(big, tokens, 1))[:3] or None)
        )
    small = make(model_with_tokenizer, async_scheduling, cpu_kv_tokens=64, enable_prefix_caching=False)
    outs = small.generate(PROMPTS, params, use_tqdm=False)
    assert small.engine.core.scheduler.num_preemptions > 0
    assert sum(sp.bad_words is not None for sp in params) >= 3
    for prompt, out, sp in zip(PROMPTS, outs, params):
        check_greedy(small, prompt, out.outputs[0].token_ids, sp, word_ids(small, sp.bad_words or []))
