"""A request may not ask for more logprobs a token than the vocabulary holds, even where `max_logprobs` is larger:
such a request used to pass the front door and then fail the engine's step (an IndexError building its dicts),
leaving the engine dead for every other request."""

from __future__ import annotations

import pytest

from roseinfer import InvalidRequestError, SamplingParams
from tests.engine.test_logprobs import VOCAB
from tests.engine.test_min_tokens import make


def test_logprobs_past_the_vocabulary_are_refused_alone(llama_dir):
    llm = make(llama_dir, max_logprobs=1000)
    params = [
        SamplingParams(max_tokens=2, logprobs=VOCAB + 1),
        SamplingParams(max_tokens=2, logprobs=VOCAB),  # the whole vocabulary: allowed
    ]
    with pytest.raises(InvalidRequestError, match="logprobs") as info:
        llm.generate([[5, 6], [7, 8]], params, use_tqdm=False)
    assert list(info.value.errors) == [0]
    ok = info.value.outputs[1]
    assert ok is not None and len(ok.outputs[0].token_ids) == 2
    assert all(len(entry) == VOCAB for entry in ok.outputs[0].logprobs)
    # The engine still serves.
    again = llm.generate([[9, 10]], SamplingParams(max_tokens=1, logprobs=3), use_tqdm=False)[0]
    assert len(again.outputs[0].logprobs[0]) in (3, 4)
