"""LONG_TILE (the 128 x 128 prefill tile of long chunks, kernels/prefill_plan.py) as the engine serves: a bf16
llama with 128-wide heads prefills a 4,100-token prompt in 1,024-token chunks, the last three over at least as
many cached tokens, so they take the long tile. Its prompt logprobs against a float32 torch-backend forward of
the whole prompt, beside the same engine with key splits off (the plain grid at the default tile)."""

from __future__ import annotations

import re

import pytest
import torch

from roseinfer import LLM, SamplingParams
from roseinfer.bench.jit_watch import watch_triton_compiles
from roseinfer.kernels import paged_prefill_attention, paged_prefill_ws
from roseinfer.kernels.prefill_plan import LONG_TILE
from tests.engine.test_prompt_logprobs import reference
from tests.gpu.conftest import free_gpu
from tests.models.test_hf_parity import random_prompts
from tests.models.tiny_models import make_hf_model

pytestmark = pytest.mark.gpu

CHUNK = 1024
PROMPT = 4 * CHUNK + 4  # three long-tile chunks after the first, then 4 tokens
HIDDEN = 256
# A prefill kernel variant of LONG_TILE's 128-row tiles, as the compile watch names it (`describe_variant`): the
# Triton kernel's, or on Hopper the warp-specialised kernel's (launches that cut no key).
LONG_VARIANT = re.compile(rf"^_prefill(_ws)?_kernel\[.*\bBLOCK_M={LONG_TILE[0]}\b")


def save_model(directory: str, num_heads: int, num_kv_heads: int) -> int:
    """A 2-layer llama with 128-wide heads, its weights scaled so each projection gains what the tiny configs'
    do at a hidden size of 64 (unscaled, attention is near one-hot and bf16's near-ties flip). Returns the
    vocabulary size."""
    model = make_hf_model(
        "llama",
        seed=5,
        hidden_size=HIDDEN,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=128,
        max_position_embeddings=8192,
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_((64 / HIDDEN) ** 0.5)
    model.save_pretrained(directory, safe_serialization=True)
    return model.config.vocab_size


def forget_prefill_variants() -> None:
    """Drops the prefill kernels' variants held in this process, so the next launch of each reaches Triton's
    compile hooks again (from its disk cache, if there). Tests run before in this process (the kernels' own)
    compile the very variants start-up must: without this the start-up watch could not see them."""
    for launcher in (paged_prefill_attention.launcher, paged_prefill_ws.launcher):
        launcher.kernel.device_caches.clear()
        launcher.forget()


def engine(directory: str, dtype: str, backend: str, key_splits: bool = True, eager: bool = True) -> LLM:
    return LLM(
        directory,
        device="cuda",
        dtype=dtype,
        block_size=16,
        attention_backend=backend,
        enforce_eager=eager,  # prompt logprobs run eagerly anyway
        num_kv_blocks=2 * PROMPT // 16,
        max_num_seqs=4,
        max_num_batched_tokens=CHUNK,
        max_model_len=PROMPT + 16,
        prefill_key_splits=key_splits,
    )


def served_errors(llm: LLM, prompt: list[int], ref: torch.Tensor) -> tuple[torch.Tensor, dict[str, int]]:
    """|logprob - reference| of each prompt token past the first chunk (the long tile's rows where it runs),
    and the runner's step paths."""
    asked = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, prompt_logprobs=0)
    (out,) = llm.generate([prompt], asked, use_tqdm=False)
    got = out.prompt_logprobs
    assert got is not None and len(got) == len(prompt)
    errors = [
        abs(got[i][prompt[i]].logprob - float(ref[i - 1, prompt[i]])) for i in range(CHUNK, len(prompt))
    ]
    return torch.tensor(errors), dict(llm.engine.core.runner.step_paths)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads"), [(4, 2), (32, 8)], ids=["4-heads-keys-cut", "llama8b-heads-no-cut"]
)
def test_long_tile_prompt_logprobs_match_a_float32_forward(
    tmp_path, num_heads: int, num_kv_heads: int
) -> None:
    """With 4 heads the long tile's 8 q tiles a head leave most of a wave free, so the planner cuts their keys
    (the merge variant); with llama-3.1-8b's 32 it does not (the variant without it). Either way the long-tile
    engine's errors against float32 stay within bf16's reach (the torch backend in bf16 on a CPU: 0.034 on
    average, 0.20 at most, at 32 heads) and near those of the default tile's."""
    directory = str(tmp_path)
    vocab = save_model(directory, num_heads, num_kv_heads)
    (prompt,) = random_prompts(vocab, seed=9, lengths=[PROMPT])
    ref_engine = engine(directory, "float32", "torch")
    ref = reference(ref_engine, prompt)
    del ref_engine
    free_gpu()

    forget_prefill_variants()
    with watch_triton_compiles() as at_start:
        llm = engine(directory, "bfloat16", "triton")
    with watch_triton_compiles() as serving:
        long_errors, paths = served_errors(llm, prompt, ref)
    assert paths["long_tile"] == 3, paths
    # At the default tile the 4-token last chunk over 4,096 cached tokens cuts its keys at either head count,
    # and the first (fresh) chunk's 16 q tiles a head fill no wave at 4 heads; the long chunks cut at 4 only.
    assert paths["key_split"] == (5 if num_heads == 4 else 1), paths
    # The long tile's variants compile at start-up (warm_up_long_tile), not while a step waits on them.
    assert sum(bool(LONG_VARIANT.search(v)) for v in at_start.variants) == 2, at_start.variants
    assert not any(LONG_VARIANT.search(v) for v in serving.variants), serving.variants
    del llm
    free_gpu()
    plain_errors, plain_paths = served_errors(
        engine(directory, "bfloat16", "triton", key_splits=False), prompt, ref
    )
    assert plain_paths["long_tile"] == 0 and plain_paths["key_split"] == 0, plain_paths
    free_gpu()

    long_mean, plain_mean = long_errors.mean().item(), plain_errors.mean().item()
    assert long_mean < 0.1 and long_errors.max().item() < 1.0, (long_mean, long_errors.max().item())
    assert long_mean <= 2 * plain_mean + 0.01, (long_mean, plain_mean)


def test_long_tile_graph_twins_match_a_float32_forward(tmp_path) -> None:
    """Mixed-step graphs with LONG_TILE twins, at llama-3.1-8b's heads in 1,024-token steps: a 1,536-token prompt's
    second chunk (512 over 1,024 cached tokens, whose 64-row map cuts no key) replays a twin by the graphs' rule,
    a 1,792-token prompt's (768 over 1,024) by LONG_TILE's own; the first chunks (fresh) replay 64-row graphs. The
    same engine eager takes LONG_TILE's uncut map for both chunks by the same rules (`TilePlanner.eager_map`). The
    first token's top logprobs after each prompt against a float32 forward of it, beside the plain grid's (key
    splits off: no tile maps, the 64-row tile)."""
    if not paged_prefill_ws.runs_on(torch.device("cuda"), torch.bfloat16, torch.bfloat16, 128, 16):
        pytest.skip("twins are captured only where the warp-specialised kernel runs (Hopper)")
    directory = str(tmp_path)
    vocab = save_model(directory, 32, 8)
    prompts = random_prompts(vocab, seed=11, lengths=[CHUNK + 512, CHUNK + 768])
    ref_engine = engine(directory, "float32", "torch")
    refs = [reference(ref_engine, p)[-1] for p in prompts]
    del ref_engine
    free_gpu()
    asked = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=5)

    def errors(llm: LLM) -> torch.Tensor:
        errs = []
        for prompt, ref in zip(prompts, refs, strict=True):
            (out,) = llm.generate([prompt], asked, use_tqdm=False)
            (top,) = out.outputs[0].logprobs
            errs += [abs(lp.logprob - float(ref[token])) for token, lp in top.items()]
        return torch.tensor(errs)

    forget_prefill_variants()
    llm = engine(directory, "bfloat16", "triton", eager=False)
    mixed = llm.engine.core.runner.mixed_graphs
    assert mixed is not None and mixed.long_sizes and set(mixed.long_graphs) == set(mixed.long_sizes)
    with watch_triton_compiles() as serving:
        twin_errors = errors(llm)
    paths = dict(llm.engine.core.runner.step_paths)
    assert (paths["mixed_graph"], paths["long_tile"], paths["eager"]) == (4, 2, 0), paths
    assert not any(LONG_VARIANT.search(v) for v in serving.variants), serving.variants
    del llm, mixed
    free_gpu()
    llm = engine(directory, "bfloat16", "triton")
    eager_errors = errors(llm)
    paths = dict(llm.engine.core.runner.step_paths)
    assert (paths["long_tile"], paths["eager"]) == (2, 4), paths
    del llm
    free_gpu()
    plain_errors = errors(engine(directory, "bfloat16", "triton", key_splits=False))
    free_gpu()
    plain_mean = plain_errors.mean().item()
    for name, errs in (("twins", twin_errors), ("eager", eager_errors)):
        assert errs.mean().item() < 0.1 and errs.max().item() < 0.5, (name, errs)
        assert errs.mean().item() <= 2 * plain_mean + 0.02, (name, errs.mean().item(), plain_mean)
