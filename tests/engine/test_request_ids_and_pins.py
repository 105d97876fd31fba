"""Request ids and pinned prefixes at the front door (gaps the mutation audit found)."""

from __future__ import annotations

import time

import pytest

from roseinfer import SamplingParams
from tests.engine.test_min_tokens import make, prefer


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


def test_n_samples_finish_when_their_last_sample_does(llama_dir) -> None:
    """RequestOutput.metrics.finished_time of an n > 1 request is its last sample's, not its first's."""
    llm = make(llama_dir)
    prefer(llm, 77, bias=5.0)  # a stop token drawn often enough that samples end at different steps

    def params(seed: int) -> SamplingParams:
        return SamplingParams(n=2, temperature=1.0, seed=seed, max_tokens=8, stop_token_ids=[77])

    def lengths(seed: int) -> list[int]:
        out = llm.generate([[5, 6, 7]], params(seed), use_tqdm=False)[0]
        return [len(c.token_ids) for c in out.outputs]

    seed = next(s for s in range(30) if (n := lengths(s))[0] < n[1])  # the first sample ends first
    engine = llm.engine
    rid = engine.add_request([5, 6, 7], params(seed))
    finals = []
    while engine.has_unfinished_requests():
        before = time.monotonic()
        finals += [(o, before) for o in engine.step() if o.request_id == rid and o.finished]
    [(final, before)] = finals
    assert final.metrics.finished_time >= before
