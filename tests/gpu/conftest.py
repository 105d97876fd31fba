"""What the GPU engine tests share: the `model_dir` fixture (each tiny model saved in HF format once a module),
`free_gpu` between engines, and the float32 Triton engine run with graphs, then eagerly (`graphs_then_eager`)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence

import pytest
import torch

from roseinfer import LLM, SamplingParams
from tests.models.tiny_models import TINY_CONFIGS, save_hf_model

Tokens = list[list[list[int]]]  # per prompt, per sample: the token ids


@pytest.fixture(scope="module", params=sorted(TINY_CONFIGS))
def model_dir(request, tmp_path_factory):
    """(the HF model, its directory) for each tiny config."""
    directory = tmp_path_factory.mktemp(f"gpu-{request.param}")
    model = save_hf_model(request.param, directory)
    return model, str(directory)


def free_gpu() -> None:
    gc.collect()  # engines tests tie in cycles of their own
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def fp32_triton_engine(directory: str, eager: bool, **kwargs) -> LLM:
    """The Triton backend in float32, eagerly or with graphs."""
    return LLM(
        directory,
        device="cuda",
        dtype="float32",
        block_size=16,
        attention_backend="triton",
        enforce_eager=eager,
        **kwargs,
    )


def run(llm: LLM, prompts, params) -> Tokens:
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]


def graphs_then_eager(
    directory: str,
    prompts: Sequence,
    params: list[SamplingParams] | Callable[[LLM], list[SamplingParams]],
    after: Callable[[LLM], None] = lambda llm: None,
    **kwargs,
) -> tuple[Tokens, LLM, list[SamplingParams]]:
    """Runs `prompts` on the engine with graphs (asserting decode graphs replayed, then `after(engine)`), frees
    it, and asserts an eager engine with the same `kwargs` samples the same tokens. `params` may be built from
    the graphs engine (e.g. from its tokenizer). Returns the tokens, the eager engine (the reference for
    greedy checks) and the params."""
    fast = fp32_triton_engine(directory, False, **kwargs)
    if callable(params):
        params = params(fast)
    got = run(fast, prompts, params)
    assert fast.engine.core.runner.step_paths["decode_graph"] > 0
    after(fast)
    del fast
    free_gpu()
    ref = fp32_triton_engine(directory, True, **kwargs)
    assert run(ref, prompts, params) == got
    return got, ref, params
