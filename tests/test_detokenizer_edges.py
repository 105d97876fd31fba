"""IncrementalDetokenizer edges the mutation audit found untested: a pile of skipped special tokens (work must
stay linear), and a decoder whose invalid-byte text is not prefix-stable (the hard cap must still push it out)."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from roseinfer.tokenizer import IncrementalDetokenizer
from tests.test_tokenizer import encode, stream, tok  # noqa: F401 (a fixture)

FFFD = "\ufffd"


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
