"""IncrementalDetokenizer's spaces_between_special_tokens, as vLLM's: with special tokens kept and the flag off,
two added tokens in a row have nothing between them. The reference is HF's whole decode (tests/wordpiece_tokenizer.py)."""

from __future__ import annotations

import random

import pytest
from transformers import PreTrainedTokenizerBase

from roseinfer.tokenizer import IncrementalDetokenizer
from tests.test_tokenizer import stream, tok  # noqa: F401 (fixture)
from tests.wordpiece_tokenizer import added_ids, expected_text, save_wordpiece_tokenizer


@pytest.fixture(scope="module")
def wp_tok(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerBase:
    return save_wordpiece_tokenizer(tmp_path_factory.mktemp("wordpiece"))


def ids_of(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_two_special_tokens_in_a_row_have_no_space_between_them(wp_tok: PreTrainedTokenizerBase) -> None:
    out = ids_of(wp_tok, "hello <a><b> world <extra><a> fox [SEP]")
    assert wp_tok.decode(out) == "hello <a> <b> world <extra> <a> fox [SEP]"  # the decoder's spaces
    on = IncrementalDetokenizer(wp_tok, [], skip_special_tokens=False)
    off = IncrementalDetokenizer(wp_tok, [], skip_special_tokens=False, spaces_between_special_tokens=False)
    assert "".join(stream(on, out)) == wp_tok.decode(out)
    assert "".join(stream(off, out)) == "hello <a><b> world <extra><a> fox [SEP]"
    assert off.text == expected_text(wp_tok, [], out, skip=False, spaces=False)


def test_the_flag_does_nothing_where_special_tokens_are_skipped(wp_tok: PreTrainedTokenizerBase) -> None:
    """As vLLM: skip_special_tokens=True decodes as before, the plain added token (not skipped) included."""
    out = ids_of(wp_tok, "hello <a><b> world <extra><extra> fox")
    det = IncrementalDetokenizer(wp_tok, [], skip_special_tokens=True, spaces_between_special_tokens=False)
    assert "".join(stream(det, out)) == wp_tok.decode(out, skip_special_tokens=True) == det.text
    assert det.text == "hello world <extra> <extra> fox"


def test_the_first_output_token_never_joins_the_prompt(wp_tok: PreTrainedTokenizerBase) -> None:
    """As vLLM: only output tokens count; a prompt ending in a special token leaves the first one as is."""
    prompt, out = ids_of(wp_tok, "hello <a>"), ids_of(wp_tok, "<b><a> world")
    det = IncrementalDetokenizer(
        wp_tok, prompt, skip_special_tokens=False, spaces_between_special_tokens=False
    )
    assert "".join(stream(det, out)) == " <b><a> world"
    assert det.text == expected_text(wp_tok, prompt, out, skip=False, spaces=False)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("spaces", [False, True])
def test_random_streams_match_whole_decodes(
    wp_tok: PreTrainedTokenizerBase, seed: int, skip: bool, spaces: bool
) -> None:
    rng = random.Random(seed)
    added = sorted(added_ids(wp_tok) - {wp_tok.unk_token_id})
    words = [i for i in range(len(wp_tok)) if i not in added_ids(wp_tok)]
    pool = added * 4 + words  # added tokens often, and often in runs
    prompt = [rng.choice(pool) for _ in range(rng.randint(1, 6))]
    out = [rng.choice(pool) for _ in range(rng.randint(1, 40))]
    det = IncrementalDetokenizer(
        wp_tok, prompt, skip_special_tokens=skip, spaces_between_special_tokens=spaces
    )
    sizes = [rng.randint(1, 3) for _ in out]
    text = "".join(stream(det, out, sizes))
    assert text == expected_text(wp_tok, prompt, out, skip, spaces) == det.text


@pytest.mark.parametrize("spaces", [False, True])
def test_a_byte_level_decoder_puts_no_spaces_either_way(tok: PreTrainedTokenizerBase, spaces: bool) -> None:  # noqa: F811
    """The tests' byte-level BPE puts nothing between tokens: the flag changes nothing there (as vLLM's)."""
    out = tok.encode("Hi<|im_start|><|im_end|><|endoftext|> there<|im_end|>", add_special_tokens=False)
    det = IncrementalDetokenizer(tok, [], skip_special_tokens=False, spaces_between_special_tokens=spaces)
    assert (
        "".join(stream(det, out))
        == tok.decode(out)
        == "Hi<|im_start|><|im_end|><|endoftext|> there<|im_end|>"
    )
