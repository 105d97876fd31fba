"""Request ids and pinned prefixes at the front door (gaps the mutation audit found)."""

from __future__ import annotations

import pytest

from roseinfer import SamplingParams
from tests.engine.test_min_tokens import make


def test_a_request_id_in_use_is_refused_and_the_first_keeps_running(llama_dir) -> None:
    engine = make(llama_dir).engine
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    engine.add_request([5, 6, 7], params, request_id="r")
    with pytest.raises(ValueError, match="request_id 'r' is already in use"):
        engine.add_request([8, 9], params, request_id="r")
    finals = []
    while engine.has_unfinished_requests():
        finals += [o for o in engine.step() if o.finished]
    assert [(o.request_id, o.prompt_token_ids, len(o.outputs[0].token_ids)) for o in finals] == [
        ("r", [5, 6, 7], 3)
    ]


def test_a_pinned_prefix_is_cut_to_whole_blocks(llama_dir) -> None:
    llm = make(llama_dir)  # blocks of 4 tokens
    assert llm.engine.pin_prefix(list(range(20, 30))) == 8
    assert len(llm.engine.core.kv.pool.pinned) == 2
    with pytest.raises(ValueError, match="shorter than one block"):
        llm.engine.pin_prefix([20, 21, 22])
