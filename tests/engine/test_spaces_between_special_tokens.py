"""`SamplingParams.spaces_between_special_tokens` through the engine, as vLLM v1's: with special tokens kept, False
puts nothing between two added tokens in a row. A tiny model over a WordPiece tokenizer (whose decoder puts a
space between tokens) samples among words and added tokens; each output's text is checked against HF's whole
decodes of its token ids (tests/wordpiece_tokenizer.py)."""

from __future__ import annotations

import shutil

import pytest

from roseinfer import LLM, RequestOutputKind, SamplingParams
from tests.wordpiece_tokenizer import added_ids, expected_text, save_wordpiece_tokenizer


@pytest.fixture(scope="module")
def wp_llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    from tests.models.tiny_models import save_hf_model

    tok_dir = tmp_path_factory.mktemp("wordpiece")
    tok = save_wordpiece_tokenizer(tok_dir)
    model_dir = tmp_path_factory.mktemp("llama-wordpiece")
    eos = tok.convert_tokens_to_ids("[SEP]")
    save_hf_model("llama", model_dir, vocab_size=len(tok), bos_token_id=eos, eos_token_id=eos)
    for f in tok_dir.iterdir():
        shutil.copy(f, model_dir / f.name)
    return LLM(str(model_dir), device="cpu", block_size=4, cpu_kv_tokens=1024)


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("spaces", [False, True])
def test_texts_match_whole_decodes(wp_llm: LLM, skip: bool, spaces: bool) -> None:
    tok = wp_llm.tokenizer
    added = sorted(added_ids(tok) - {tok.unk_token_id})
    words = [tok.convert_tokens_to_ids(w) for w in ("hello", "world", "fox", "the")]
    params = SamplingParams(
        temperature=1.0,
        seed=11,
        n=3,
        max_tokens=24,
        ignore_eos=True,
        allowed_token_ids=added + words,  # added tokens often, and often in runs
        skip_special_tokens=skip,
        spaces_between_special_tokens=spaces,
    )
    prompt = tok.encode("hello world <a>", add_special_tokens=False)
    out = wp_llm.generate([prompt], params, use_tqdm=False)[0]
    runs = 0
    for c in out.outputs:
        assert c.text == expected_text(tok, prompt, c.token_ids, skip, spaces)
        runs += sum(a in added and b in added for a, b in zip(c.token_ids, c.token_ids[1:]))
    assert runs > 0  # the case the flag is about came up


def test_streamed_deltas_add_up_to_the_joined_text(wp_llm: LLM) -> None:
    tok = wp_llm.tokenizer
    added = sorted(added_ids(tok) - {tok.unk_token_id})
    params = SamplingParams(
        temperature=1.0,
        seed=5,
        max_tokens=20,
        ignore_eos=True,
        allowed_token_ids=added + [tok.convert_tokens_to_ids("fox")],
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        output_kind=RequestOutputKind.DELTA,
    )
    engine = wp_llm.engine
    prompt = tok.encode("hello", add_special_tokens=False)
    rid = engine.add_request(prompt, params)
    text, ids = "", []
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id == rid:
                text, ids = text + o.outputs[0].text, ids + o.outputs[0].token_ids
    assert len(ids) == 20 and text == expected_text(tok, prompt, ids, skip=False, spaces=False)
    assert text != expected_text(tok, prompt, ids, skip=False, spaces=True)
