"""`SamplingParams.detokenize`, as vLLM v1's: False leaves every output's text empty and its logprobs' (and
prompt logprobs') decoded tokens None; the tokens, logprob values and finish reasons are those of the same
request with detokenize on. Stop strings need it (a ValueError at construction, as vLLM's)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from roseinfer import LLM, RequestOutputKind, SamplingParams
from tests.engine.test_output_kind import assert_same_logprobs


def strip_text(entries: list | None) -> list | None:
    """Logprob entries with their decoded tokens dropped (the part detokenize=False leaves out)."""
    if entries is None:
        return None
    return [None if e is None else {t: replace(x, decoded_token=None) for t, x in e.items()} for e in entries]


@pytest.mark.parametrize("kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA])
def test_no_text_but_the_same_tokens_and_logprobs(llm: LLM, kind: RequestOutputKind) -> None:
    params = SamplingParams(
        temperature=1.0, seed=3, n=2, max_tokens=8, logprobs=2, prompt_logprobs=1, output_kind=kind
    )
    engine = llm.engine
    on = engine.add_request("Hello world", params)
    off = engine.add_request("Hello world", replace(params, detokenize=False))
    outs: dict[str, list] = {on: [], off: []}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id].append(o)
    assert outs[off] and all(c.text == "" for o in outs[off] for c in o.outputs)
    assert any(c.text for o in outs[on] for c in o.outputs)
    for name in ("token_ids", "finish_reason", "stop_reason", "index"):
        assert [[getattr(c, name) for c in o.outputs] for o in outs[off]] == [
            [getattr(c, name) for c in o.outputs] for o in outs[on]
        ]
    for got, want in zip(outs[off], outs[on], strict=True):
        assert_same_logprobs(got.prompt_logprobs, strip_text(want.prompt_logprobs))
        for c, w in zip(got.outputs, want.outputs, strict=True):
            assert_same_logprobs(c.logprobs, strip_text(w.logprobs))
    first = outs[on][0]
    assert first.prompt_logprobs[1] and all(x.decoded_token for x in first.prompt_logprobs[1].values())


def test_generate_with_detokenize_off_returns_the_tokens_alone(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, skip_special_tokens=False)
    want, got = llm.generate(["Hello", "Hello"], [params, replace(params, detokenize=False)], use_tqdm=False)
    assert want.outputs[0].text and got.outputs[0].text == ""
    assert got.outputs[0].token_ids == want.outputs[0].token_ids


def test_stop_strings_need_detokenize() -> None:
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(stop=["x"], detokenize=False)
    assert SamplingParams(stop_token_ids=[3], detokenize=False).stop_token_ids == [3]


@pytest.mark.parametrize("name", ["detokenize", "spaces_between_special_tokens"])
@pytest.mark.parametrize("bad", [0, 1, "yes", None])
def test_the_flags_must_be_bools(name: str, bad: object) -> None:
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: bad})
    assert getattr(SamplingParams(), name) is True
