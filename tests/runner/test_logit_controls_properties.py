"""Mutation audit (runner/logit_controls.py, bad_words.py): bad words whose last tokens coincide while a token is
in flight, a bad word's ban against a large logit_bias (vLLM v1: bans first, then the bias is added, so a
banned id stays at -inf), and tokenizing words at the edge of the vocabulary or to nothing. References are the
plain-Python rule of `tests/engine/logit_reference.py` (`reference_banned`)."""

from __future__ import annotations

import itertools

import pytest
import torch

from roseinfer.bad_words import tokenize_bad_words
from roseinfer.runner.logit_controls import RowControls, StepControls, bad_word_step
from roseinfer.runner.sampler import SamplingBatch, banned_pairs, sample
from roseinfer.sampling_params import SamplingParams
from tests.engine.logit_reference import reference_banned
from tests.runner.test_logit_controls import CPU, VOCAB, request

LAST = 5  # the last token the words share, and the rows' favourite


def greedy_with_words(words, known: list[int], in_flight: int | None, bias: dict[int, float] | None) -> int:
    """The greedy token of one row whose favourite is LAST, with `words` banned; `in_flight`: the output's
    last token, still in flight (row 2 of the previous launch's sampled tokens), or None."""
    sp = SamplingParams(temperature=0.0, bad_words=["placeholder"], logit_bias=bias)
    req = request(known, sp, words, pending=1 if in_flight is None else 2)
    last_sampled = None
    if in_flight is not None:
        req.pending_row = 2
        last_sampled = torch.tensor([0, 0, in_flight, 0], dtype=torch.int32)
    logits = torch.zeros(1, VOCAB)
    logits[0, LAST] = 10.0
    logits[0, 11] = 1.0
    now, waiting = bad_word_step([req], last_sampled, CPU)
    batch = SamplingBatch.build([sp], [None], VOCAB, CPU)
    controls = StepControls(RowControls.build([sp], VOCAB, CPU), waiting, last_sampled)
    return int(sample(logits, batch, banned_pairs(now, VOCAB, CPU), None, controls).item())


@pytest.mark.parametrize("words", list(itertools.permutations([(1, LAST), (2, LAST), (3, 4, LAST)])))
@pytest.mark.parametrize("token", [1, 2, 3, 4, 9])
def test_words_sharing_a_last_token_each_ban_it_while_a_token_is_in_flight(words, token):
    """Several words end in the same id and wait on different tokens in flight: the id is banned whenever
    one of them matches, whatever order the words come in."""
    known = [3]
    banned = LAST in reference_banned(words, [*known, token])
    assert greedy_with_words(words, known, token, None) == (11 if banned else LAST), (words, token)


@pytest.mark.parametrize("in_flight", [True, False])
def test_a_large_bias_does_not_lift_a_bad_word_ban(in_flight):
    """vLLM v1 bans a bad word's last token (-inf) before it adds the logit bias: -inf plus any bias is still
    -inf, however large the bias."""
    words = ((2, LAST),)
    bias = {LAST: 1e6}
    if in_flight:
        assert greedy_with_words(words, [7], 2, bias) == 11
        assert greedy_with_words(words, [7], 3, bias) == LAST  # not the word: the bias stands
    else:
        assert greedy_with_words(words, [7, 2], None, bias) == 11
        assert greedy_with_words(words, [7, 3], None, bias) == LAST


class TableTokenizer:
    def __init__(self, table: dict[str, list[int]]) -> None:
        self.table = table

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False
        return self.table[text]


def test_words_must_tokenize_within_the_vocabulary_and_to_something():
    """The last id of the vocabulary is a word's token; the first id past it is refused wherever it sits in
    the word, as a ValueError naming bad_words; so is a word that encodes to no tokens."""
    tok = TableTokenizer(
        {
            "edge": [VOCAB - 1],
            " edge": [VOCAB - 2],
            "past": [VOCAB],
            " past": [VOCAB - 2],
            "tail": [3, VOCAB],
            " tail": [4, VOCAB - 1],
            "ghost": [],
            " ghost": [6],
        }
    )
    assert tokenize_bad_words(tok, ["edge"], VOCAB) == ((VOCAB - 1,), (VOCAB - 2,))
    for word in ("past", "tail"):
        with pytest.raises(ValueError, match=rf"bad_words encode to token ids \[{VOCAB}\]"):
            tokenize_bad_words(tok, [word], VOCAB)
    with pytest.raises(ValueError, match="bad_words: 'ghost' encodes to no tokens"):
        tokenize_bad_words(tok, ["ghost"], VOCAB)


def test_bf16_logits_are_controlled_in_float32():
    """The controls work on a float32 copy of half-precision logits (vLLM's sampler works in float32): a
    bias of 1e-3 that bfloat16 would round away still decides between two equal logits, with the allowed
    mask and a bad word waiting on a token in flight in the same step."""
    sp = SamplingParams(
        temperature=0.0, allowed_token_ids=[3, 4, LAST], logit_bias={4: 1e-3}, bad_words=["w"]
    )
    req = request([7], sp, ((2, LAST),), pending=2)
    req.pending_row = 0
    last_sampled = torch.tensor([2], dtype=torch.int32)
    logits = torch.zeros(1, VOCAB, dtype=torch.bfloat16)
    logits[0, [3, 4]] = 1.0
    logits[0, [LAST, 9]] = 4.0  # LAST: banned (the token in flight completes the word); 9: not allowed
    assert (logits[0, 4] + 1e-3).item() == 1.0  # in bf16 the bias is lost
    now, waiting = bad_word_step([req], last_sampled, CPU)
    batch = SamplingBatch.build([sp], [None], VOCAB, CPU)
    controls = StepControls(RowControls.build([sp], VOCAB, CPU), waiting, last_sampled)
    assert sample(logits, batch, banned_pairs(now, VOCAB, CPU), None, controls).tolist() == [4]


def test_a_token_in_flight_with_no_earlier_step_is_an_error():
    sp = SamplingParams(temperature=0.0, bad_words=["w"])
    req = request([7], sp, ((2, LAST),), pending=2)
    req.pending_row = 0
    with pytest.raises(RuntimeError, match="in flight"):
        bad_word_step([req], None, CPU)
