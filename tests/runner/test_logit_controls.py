"""allowed_token_ids, logit_bias and bad_words in the sampler (`runner/logit_controls.py`, `bad_words.py`),
against plain-Python references of vLLM v1's rules and order: allowed mask, bad words, min_tokens, bias, then
penalties, then the greedy argmax."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

from roseinfer.bad_words import bad_word_bans, tokenize_bad_words
from roseinfer.request import Request
from roseinfer.runner.logit_controls import RowControls, StepControls, bad_word_step
from roseinfer.runner.penalties import PenaltyTable
from roseinfer.runner.sampler import SamplingBatch, banned_pairs, sample
from roseinfer.sampling_params import SamplingParams
from tests.engine.logit_reference import NEG, reference_banned
from tests.engine.test_penalties import penalize

VOCAB = 16
CPU = torch.device("cpu")
ROWS = 32  # the penalty table's cap (max_num_seqs)


# -- bad words: which tokens a step bans ------------------------------------------------------------


def test_bad_word_bans_match_the_rule_with_and_without_a_token_in_flight():
    """Every output over a 3-token alphabet up to length 4, every word set drawn from short sequences: the
    bans with the whole output known equal the rule's; with the last token in flight, the outright bans plus
    the bans waiting on that token equal the rule's for each token it could be."""
    rng = random.Random(0)
    seqs = [s for n in (1, 2, 3) for s in itertools.product(range(3), repeat=n)]
    checked_waiting = 0
    for _ in range(300):
        words = tuple(rng.sample(seqs, 4))
        for n in range(5):
            for output in itertools.product(range(3), repeat=n):
                now, later = bad_word_bans(words, output, in_flight=False)
                assert later == [] and set(now) == reference_banned(words, output)
                if n == 0:
                    continue
                now, later = bad_word_bans(words, output[:-1], in_flight=True)
                got = set(now) | {t for t, token in later if token == output[-1]}
                assert got == reference_banned(words, output), (words, output)
                checked_waiting += bool(later)
    assert checked_waiting > 100


class FakeTokenizer:
    """Words to ids by a table: "bad" is one token, " bad" another; "two words" two tokens either way."""

    table = {
        "bad": [7],
        " bad": [8],
        "two words": [1, 2],
        " two words": [3, 2],
        "same": [4],
        " same": [4],
        "long": [5],
        " long": [6, 5],
        "big": [99],
        " big": [98],
    }

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False
        return self.table[text]


def test_bad_words_tokenize_as_vllm():
    """Leading whitespace stripped; the spaced form kept only where its first id differs and its length
    is the same."""
    tok = FakeTokenizer()
    assert tokenize_bad_words(tok, ["bad"], VOCAB) == ((7,), (8,))
    assert tokenize_bad_words(tok, ["  bad", "two words"], VOCAB) == ((7,), (8,), (1, 2), (3, 2))
    assert tokenize_bad_words(tok, ["same"], VOCAB) == ((4,),)
    assert tokenize_bad_words(tok, ["long"], VOCAB) == ((5,),)
    with pytest.raises(ValueError, match="bad_words"):
        tokenize_bad_words(tok, ["big"], VOCAB)


# -- the sampler ----------------------------------------------------------------------------------


def request(output: list[int], params: SamplingParams, words=(), pending: int = 1) -> Request:
    r = Request("r", [1, 2, 3], params)
    for t in output:
        r.append_token(t)
    r.bad_words_token_ids = words
    r.num_pending = pending
    return r


def test_sample_applies_the_controls_in_vllm_order():
    """Random rows: allowed ids, bad words (some waiting on a token in flight), min_tokens' bans, biases and
    penalties; each greedy row's token is the argmax of the reference, which takes them in vLLM v1's order."""
    rng = np.random.default_rng(1)
    g = torch.Generator().manual_seed(0)
    words = ((4,), (1, 5), (2, 3, 6), (9, 9, 7))
    decided = 0
    for trial in range(40):
        rows = []
        for _ in range(6):
            kw: dict = {}
            if rng.random() < 0.5:
                kw["allowed_token_ids"] = sorted(set(rng.integers(0, VOCAB, 5).tolist()))
            if rng.random() < 0.6:
                kw["logit_bias"] = {int(t): float(rng.normal(0, 3)) for t in rng.integers(0, VOCAB, 4)}
            if rng.random() < 0.4:
                kw.update(repetition_penalty=2.0, frequency_penalty=0.5)
            if rng.random() < 0.3:
                kw.update(min_tokens=9, stop_token_ids=[int(rng.integers(VOCAB))])
            w = words if rng.random() < 0.6 else ()
            if w:
                kw["bad_words"] = ["placeholder"]  # the ids come from `words`, set on the request
            output = rng.choice([1, 2, 3, 9, 5], size=int(rng.integers(0, 4))).tolist()
            in_flight = bool(output) and rng.random() < 0.5
            rows.append((SamplingParams(temperature=0.0, **kw), output, w, in_flight))
        logits = torch.randn(len(rows), VOCAB, generator=g) * 3
        logits[:, [5, 6, 7]] += 5.0  # the words' last tokens lead: their bans decide
        # The previous launch sampled each in-flight token in row 5 - k of its tokens.
        last_sampled = torch.zeros(len(rows), dtype=torch.int32)
        reqs = []
        for k, (sp, output, w, in_flight) in enumerate(rows):
            known = output[:-1] if in_flight else output
            r = request(known, sp, w, pending=2 if in_flight else 1)
            if in_flight:
                r.pending_row = len(rows) - 1 - k
                last_sampled[r.pending_row] = output[-1]
            reqs.append(r)
        params = [sp for sp, *_ in rows]
        batch = SamplingBatch.build(params, [None] * len(rows), VOCAB, CPU)
        assert batch.any_logit_controls == any(p.has_logit_controls for p in params)
        banned = [list(r.banned_token_ids()) for r in reqs]
        words_now, waiting = bad_word_step(reqs, last_sampled, CPU)
        for row, ids in zip(banned, words_now):
            row.extend(ids)
        controls = StepControls(RowControls.build(params, VOCAB, CPU), waiting, last_sampled)
        penalties = PenaltyTable(VOCAB, CPU, ROWS).step(reqs, last_sampled)
        got = sample(logits.clone(), batch, banned_pairs(banned, VOCAB, CPU), penalties, controls).tolist()
        for k, (sp, output, w, _) in enumerate(rows):
            row = logits[k].double().tolist()
            if sp.allowed_token_ids:
                row = [x if t in sp.allowed_token_ids else NEG for t, x in enumerate(row)]
            for t in reference_banned(w, output):
                row[t] = NEG
            if len(output) < sp.min_tokens:
                row[sp.stop_token_ids[0]] = NEG
            for t, b in (sp.logit_bias or {}).items():
                row[t] += b
            if sp.has_penalties:
                row = penalize(row, [1, 2, 3], output, sp)
            best = int(np.argmax(row))
            assert row[got[k]] > NEG and (got[k] == best or row[best] - row[got[k]] < 1e-4), (trial, k)
            decided += best != int(logits[k].argmax())
    assert decided > 60


def test_a_bias_applies_before_the_repetition_penalty():
    """vLLM v1's order: the bias first, then the penalty divides the (now positive) logit of an id seen in the
    prompt. With a bias of 3.6: (-1 + 3.6) / 2 = 1.3 loses to 1.5; the other order, -1 * 2 + 3.6 = 1.6, wins."""
    logits = torch.tensor([[-1.0, 1.5, 0.0, 0.0]])
    for bias, expected in [(3.6, 1), (4.2, 0)]:  # 4.2: (3.2) / 2 = 1.6 wins
        sp = SamplingParams(temperature=0.0, logit_bias={0: bias}, repetition_penalty=2.0)
        batch = SamplingBatch.build([sp], [None], 4, CPU)
        r = Request("r", [0], sp)
        r.num_pending = 1
        penalties = PenaltyTable(4, CPU, ROWS).step([r], None)
        controls = StepControls(RowControls.build([sp], 4, CPU), None, None)
        assert sample(logits.clone(), batch, None, penalties, controls).item() == expected, bias
