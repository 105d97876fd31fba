"""`SamplingParams.bad_words`, as vLLM v1: the words' token sequences, and which last tokens a step must ban.

Tokenizing (vLLM's `update_from_tokenizer`): each word, its leading whitespace stripped, is encoded without
special tokens as is, and again with one leading space; the spaced form is kept too only where it is a different
word token of the same length (its first id differs from the plain form's, and it has as many ids), so that the
word is banned both at the start of the text and after a space.

Banning (vLLM v1's `apply_bad_words`): for each sequence, if the sample's output (its generated tokens, never
the prompt) ends with all of the sequence but its last token, that last token may not be sampled this step; a
one-token sequence is banned always. A sequence longer than the output plus one is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

BadWords = tuple[tuple[int, ...], ...]


def tokenize_bad_words(tokenizer: Any, words: Sequence[str], vocab: int) -> BadWords:
    """The token sequences of `words` (see the module's docstring); a ValueError naming bad_words where a word
    encodes to nothing or to ids past the vocabulary."""
    sequences: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if not plain:
            raise ValueError(f"bad_words: {word!r} encodes to no tokens")
        sequences.append(plain)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences.append(spaced)
    bad = [t for seq in sequences for t in seq if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"bad_words encode to token ids {bad} outside the vocabulary [0, {vocab})")
    return tuple(dict.fromkeys(sequences))


def bad_word_bans(
    sequences: BadWords, output: Sequence[int], in_flight: bool
) -> tuple[list[int], list[tuple[int, int]]]:
    """The ids a sample may not draw next: (ids banned outright, (id, token) pairs banned only where the token
    still in flight is `token`). `output`: the sample's generated tokens the host knows; `in_flight`: one more
    follows them, sampled by a step the host has not resolved (async scheduling), known on the device only."""
    known = len(output)
    total = known + in_flight
    banned: list[int] = []
    conditional: list[tuple[int, int]] = []
    for seq in sequences:
        prefix_len = len(seq) - 1
        if prefix_len > total:
            continue
        if prefix_len == 0:
            banned.append(seq[-1])
            continue
        # The host-known part of the prefix: all of it, or all but the token in flight.
        known_len = prefix_len - in_flight
        if known_len and list(output[known - known_len :]) != list(seq[:known_len]):
            continue
        if in_flight:
            conditional.append((seq[-1], seq[prefix_len - 1]))
        else:
            banned.append(seq[-1])
    return banned, conditional
