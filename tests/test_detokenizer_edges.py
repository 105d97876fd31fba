"""IncrementalDetokenizer edges the mutation audit found untested: skipped special tokens between words of a
SentencePiece-style decoder (which strips a leading space where no text comes before), a pile of them (work must
stay linear), and a decoder whose invalid-byte text is not prefix-stable (the hard cap must still push it out)."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from roseinfer.tokenizer import IncrementalDetokenizer
from tests.test_tokenizer import encode, sp_tok, stream, tok  # noqa: F401 (fixtures)

FFFD = "\ufffd"


@pytest.mark.parametrize("specials", [1, 3, 9, 30])
def test_skipped_special_tokens_between_words_keep_the_space(
    sp_tok: PreTrainedTokenizerBase,  # noqa: F811
    specials: int,
) -> None:
    """The streamed text is the whole output decoded at once, however many skipped specials sit between two
    words (past MAX_PENDING of them, the word after them once lost its leading space)."""
    ids = encode(sp_tok, "Hello") + [sp_tok.eos_token_id] * specials + encode(sp_tok, "world")
    want = sp_tok.decode(ids, skip_special_tokens=True)
    assert want == "Hello world"
    det = IncrementalDetokenizer(sp_tok, [sp_tok.bos_token_id])
    assert "".join(stream(det, ids)) == want == det.text
    assert det.output_token_ids == ids


def test_a_pile_of_skipped_special_tokens_decodes_small_windows(tok: PreTrainedTokenizerBase) -> None:  # noqa: F811
    window_sizes: list[int] = []

    class Spy:
        all_special_ids = tok.all_special_ids

        def decode(self, ids: list[int], **kwargs: Any) -> str:
            window_sizes.append(len(ids))
            return tok.decode(ids, **kwargs)

    ids = encode(tok, "Hello world") + [tok.eos_token_id] * 300 + encode(tok, " done")
    det = IncrementalDetokenizer(Spy(), [])  # type: ignore[arg-type]
    assert "".join(stream(det, ids)) == "Hello world done"
    assert max(window_sizes) <= 32  # bounded: not the pile


def test_invalid_text_that_is_not_prefix_stable_is_still_pushed_out() -> None:
    """A decoder whose text for a never-completing run ends in U+FFFD but changes as the run grows: the hard cap
    emits it anyway rather than holding the whole run back until the stream ends."""

    class Unstable:
        def decode(self, ids: list[int], **kwargs: Any) -> str:
            return "abc"[len(ids) % 3] + FFFD if ids else ""

    det = IncrementalDetokenizer(Unstable(), [])  # type: ignore[arg-type]
    emitted = "".join(det.add([7]) for _ in range(300))
    assert emitted and det.num_pending_tokens < 150


class Undeclared:
    """A tokenizer that declares no special ids: tokens that decode to nothing are then kept as context, and
    pushed out only once they pile up."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, calls: list[int] | None = None) -> None:
        self.tokenizer = tokenizer
        self.calls = calls

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        if self.calls is not None:
            self.calls.append(len(ids))
        return self.tokenizer.decode(ids, **kwargs)


@pytest.mark.parametrize("empty", [1, 3])
def test_a_few_tokens_that_decode_to_nothing_stay_as_context(
    sp_tok: PreTrainedTokenizerBase,  # noqa: F811
    empty: int,
) -> None:
    ids = encode(sp_tok, "Hello") + [sp_tok.eos_token_id] * empty + encode(sp_tok, "world")
    det = IncrementalDetokenizer(Undeclared(sp_tok), [sp_tok.bos_token_id])  # type: ignore[arg-type]
    assert "".join(stream(det, ids)) == "Hello world"


def test_a_pile_of_tokens_that_decode_to_nothing_decodes_small_windows(
    tok: PreTrainedTokenizerBase,  # noqa: F811
) -> None:
    window_sizes: list[int] = []
    ids = encode(tok, "Hello world") + [tok.eos_token_id] * 300 + encode(tok, " done")
    det = IncrementalDetokenizer(Undeclared(tok, window_sizes), [])  # type: ignore[arg-type]
    assert "".join(stream(det, ids)) == "Hello world done"
    assert max(window_sizes) <= 32  # bounded: not the pile
