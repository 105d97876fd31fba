"""`LLM.beam_search` on the GPU: the Triton backend with graphs (the default engine) finds the same beams as the
torch backend run eagerly, in float32, with cumulative logprobs within float noise, for every tiny
architecture; and the torch backend's beams match the plain-Python HF reference."""

from __future__ import annotations

import pytest

from roseinfer import LLM, BeamSearchParams
from tests.engine.beam_reference import reference_beam_search
from tests.gpu.conftest import fp32_triton_engine, free_gpu

pytestmark = pytest.mark.gpu

PROMPTS = [[11, 12, 13, 14, 15], list(range(20, 57)), [40, 41, 42]]


@pytest.fixture(autouse=True)
def _release_engines():
    yield
    free_gpu()


def beams(llm: LLM, params: BeamSearchParams) -> list[list[tuple[list[int], float, str | None]]]:
    outs = llm.beam_search(PROMPTS, params)
    assert not llm.engine.groups and not llm.engine.has_unfinished_requests()
    return [[(s.tokens, s.cum_logprob, s.finish_reason) for s in o.sequences] for o in outs]


@pytest.mark.parametrize(
    "params",
    [
        BeamSearchParams(beam_width=1, max_tokens=8),
        BeamSearchParams(beam_width=4, max_tokens=8),
        BeamSearchParams(beam_width=3, max_tokens=6, length_penalty=0.5, ignore_eos=True),
    ],
    ids=["w1", "w4", "w3-lp0.5-ignore-eos"],
)
def test_triton_graph_engine_beam_search_matches_the_torch_backend(
    model_dir, params: BeamSearchParams
) -> None:
    model, directory = model_dir
    fast = fp32_triton_engine(directory, eager=False, max_num_seqs=32, num_kv_blocks=256)
    got = beams(fast, params)
    del fast
    free_gpu()
    ref = LLM(
        directory,
        device="cuda",
        dtype="float32",
        block_size=16,
        attention_backend="torch",
        enforce_eager=True,
        num_kv_blocks=256,  # a fixed pool: the GPU's other test processes need theirs
    )
    want = beams(ref, params)
    for g, w in zip(got, want, strict=True):
        assert [t for t, _, _ in g] == [t for t, _, _ in w]
        assert [r for _, _, r in g] == [r for _, _, r in w]
        assert [c for _, c, _ in g] == pytest.approx([c for _, c, _ in w], abs=1e-3)
    eos = ref.engine.eos_token_ids
    for prompt, w in zip(PROMPTS, want, strict=True):
        expected = reference_beam_search(
            model.to("cpu"),
            prompt,
            params.beam_width,
            params.max_tokens,
            eos,
            params.ignore_eos,
            params.length_penalty,
        )
        assert [t for t, _, _ in w] == [b.tokens for b in expected]
