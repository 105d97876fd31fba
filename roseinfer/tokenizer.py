"""Tokenizer loading, chat templating and incremental (streaming) detokenization."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

__all__ = ["IncrementalDetokenizer", "added_token_contents", "apply_chat_template", "load_tokenizer"]

_REPLACEMENT_CHAR = "\ufffd"


def _looks_like_local_path(path_or_id: str) -> bool:
    """True when ``path_or_id`` can only be a filesystem path, never a hub id (``name`` or ``org/name``)."""
    return (
        path_or_id.startswith(("/", ".", "~"))
        or "\\" in path_or_id
        or path_or_id.count("/") > 1
        or Path(path_or_id).is_absolute()
    )


def load_tokenizer(path_or_id: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Load a HF tokenizer from a local directory or a hub id.

    Raises:
        ValueError: naming ``path_or_id`` when no tokenizer can be found or loaded there.
    """
    local = Path(path_or_id).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ValueError(f"Tokenizer path {path_or_id!r} is a file; expected a tokenizer directory")
        source = str(local)
    elif _looks_like_local_path(path_or_id):
        raise ValueError(f"Tokenizer path {path_or_id!r} does not exist")
    else:
        source = path_or_id  # treat as a hub id

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"Could not load a tokenizer from {path_or_id!r}: {exc}") from exc
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise ValueError(f"{path_or_id!r} did not yield a tokenizer (got {type(tokenizer).__name__})")
    return tokenizer


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
) -> list[int]:
    """Render ``messages`` with the tokenizer's chat template and return the prompt token ids.

    Raises:
        ValueError: when the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(f"Tokenizer {name!r} has no chat template; cannot format chat messages")
    # return_dict=False: transformers >= 5 defaults to returning a BatchEncoding.
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
    )
    if isinstance(out, Mapping):  # defensive: some versions/tokenizers still return a dict
        out = out["input_ids"]
    ids = list(out)
    if ids and isinstance(ids[0], list):  # batched form
        ids = ids[0]
    return [int(i) for i in ids]


def added_token_contents(tokenizer: PreTrainedTokenizerBase) -> dict[int, str]:
    """Each added token's id and content (special or not), as the tokenizer lists them."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {int(tid): str(getattr(tok, "content", tok)) for tid, tok in added.items()}


class IncrementalDetokenizer:
    """Turn a stream of generated token ids into text deltas without breaking multi-byte characters.

    Uses the usual prefix/read-offset window: each ``add`` decodes only the tokens from ``prefix_offset``
    (a few tokens of already-emitted context, so context-dependent decoders such as SentencePiece's
    leading-space handling behave) to the end, and emits the part past the decoded context. Text ending
    in U+FFFD (an incomplete UTF-8 sequence) is held back until a later token completes it, or until
    ``flush()``. Total work over a stream is linear in the number of tokens.
    """

    #: Prompt tokens used as decoding context for the first output tokens.
    PROMPT_CONTEXT = 5
    #: Held-back tokens after which we try to emit a stable prefix (guards against endless U+FFFD runs).
    MAX_PENDING = 8
    #: Tokens kept held back when emitting a stable prefix (a UTF-8 char spans at most 4 bytes).
    HOLD = 4
    #: Hard cap on held-back tokens, for decoders whose invalid-byte output is not prefix-stable.
    HARD_MAX_PENDING = 64

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # As vLLM's: with special tokens kept and spaces between them off, an added token right after another
        # one emits just its content, dropping whatever separator the decoder puts before it. Empty: off.
        self._joined: dict[int, str] = (
            {} if skip_special_tokens or spaces_between_special_tokens else added_token_contents(tokenizer)
        )
        self._last_added = False
        # The decoding window's ids: the prompt's, then the output's but for the special tokens decoding skips.
        # Those never enter it, as `decode(all ids, skip_special_tokens=True)` never sees them: kept as context
        # they would pile up, and pushed out they would leave a SentencePiece-style decoder no text before the
        # next word, whose leading space it then strips.
        self._ids: list[int] = [int(i) for i in prompt_token_ids]
        self._output_ids: list[int] = []
        self._specials = (
            frozenset(getattr(tokenizer, "all_special_ids", ())) if skip_special_tokens else frozenset()
        )
        self._skipped: dict[int, bool] = {}
        self._read_offset = len(self._ids)
        self._prefix_offset = max(len(self._ids) - self.PROMPT_CONTEXT, 0)
        self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        while self._prefix_text.endswith(_REPLACEMENT_CHAR):
            # The window starts inside a character: byte-fallback decoders (SentencePiece's <0xNN> tokens)
            # then turn the whole byte run, its last character included, into U+FFFD. Start it later; where
            # no start decodes cleanly the prompt itself ends mid-character, and the output is decoded alone.
            self._prefix_offset += 1
            self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        self._text_parts: list[str] = []

    # -- public API ---------------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        """All output text emitted so far (the concatenation of every returned delta)."""
        if len(self._text_parts) > 1:
            self._text_parts = ["".join(self._text_parts)]
        return self._text_parts[0] if self._text_parts else ""

    @property
    def output_token_ids(self) -> list[int]:
        return list(self._output_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Output tokens whose text is still held back."""
        return len(self._ids) - self._read_offset

    def add(self, new_token_ids: Sequence[int]) -> str:
        """Append newly generated token ids; return the newly completed text (possibly ``""``).

        The ids are taken one at a time: a chunk ending inside a character would hide the clean boundaries
        within it, and byte-fallback decoders turn a byte run that ends mid-character into U+FFFD throughout,
        its complete characters included, until the held-back run is long enough to be pushed out as is.
        """
        return "".join([self._add_one(int(i)) for i in new_token_ids])

    def _add_one(self, token_id: int) -> str:
        self._output_ids.append(token_id)
        if token_id in self._specials and self._skips(token_id):
            return ""
        joined = bool(self._joined) and self._joins(token_id)
        self._ids.append(token_id)
        n = len(self._ids)
        if joined:
            return self._emit(self._joined[token_id], n)
        new_text = self._decode(self._prefix_offset, n)
        pending = n - self._read_offset
        if not new_text.endswith(_REPLACEMENT_CHAR):
            # Clean end: emit. Tokens that decode to nothing (skipped special tokens) are kept as context
            # unless they pile up.
            if len(new_text) > len(self._prefix_text) or pending > self.MAX_PENDING:
                return self._advance(new_text, n)
            return ""
        if pending > self.MAX_PENDING:
            # A long run ending in U+FFFD: emit up to a cut that later tokens can no longer change.
            cut = n - self.HOLD
            cut_text = self._decode(self._prefix_offset, cut)
            if new_text.startswith(cut_text) or pending > self.HARD_MAX_PENDING:
                return self._advance(cut_text, cut)
        return ""

    def flush(self) -> str:
        """Emit whatever is still held back (possibly containing U+FFFD); call once the stream ends."""
        n = len(self._ids)
        if n == self._read_offset:
            return ""
        return self._advance(self._decode(self._prefix_offset, n), n)

    # -- internals ----------------------------------------------------------------------------------------
    def _joins(self, token_id: int) -> bool:
        """Whether this added token follows another with nothing held back between: its text is then its
        content alone. The first output token never joins, whatever the prompt ends with (as vLLM's)."""
        added = token_id in self._joined
        joins = added and self._last_added and self.num_pending_tokens == 0
        self._last_added = added
        return joins

    def _skips(self, token_id: int) -> bool:
        """Whether decoding drops this special token (asked of the tokenizer once per id)."""
        skipped = self._skipped.get(token_id)
        if skipped is None:
            skipped = self._skipped[token_id] = self._decode_ids([token_id]) == ""
        return skipped

    def _decode(self, start: int, end: int) -> str:
        if start >= end:
            return ""
        return self._decode_ids(self._ids[start:end])

    def _decode_ids(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        if not isinstance(text, str):  # pragma: no cover - only for misbehaving tokenizers
            raise TypeError(f"tokenizer.decode returned {type(text).__name__}, expected str")
        return text

    def _advance(self, window_text: str, end: int) -> str:
        """Emit ``window_text`` past the context and move the window so it ends at token ``end``."""
        return self._emit(window_text[len(self._prefix_text) :], end)

    def _emit(self, delta: str, end: int) -> str:
        """Emit ``delta`` as the text of the tokens up to ``end`` and move the window to end there."""
        self._prefix_offset, self._read_offset = self._read_offset, end
        self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        if delta:
            self._text_parts.append(delta)
        return delta
