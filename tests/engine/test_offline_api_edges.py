"""Edges of the offline entrypoint (`entrypoints/llm.py`) the mutation audit found untested."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from roseinfer import LLM, SamplingParams
from roseinfer.entrypoints.llm import load_prefix_file, make_engine_config

MAX_POSITIONS = 512  # the tiny llama's max_position_embeddings


def test_an_empty_batch_gives_no_outputs(llm: LLM) -> None:
    assert llm.generate([], SamplingParams(max_tokens=2), use_tqdm=False) == []
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize(
    ("asked", "want"), [(None, MAX_POSITIONS), (0, MAX_POSITIONS), (MAX_POSITIONS, MAX_POSITIONS), (7, 7)]
)
def test_max_model_len_zero_or_none_is_the_model_s_and_its_own_limit_is_allowed(
    llama_dir, asked, want
) -> None:
    config, _ = make_engine_config(llama_dir, device="cpu", max_model_len=asked)
    assert config.max_model_len == want
    with pytest.raises(ValueError, match="max_model_len"):
        make_engine_config(llama_dir, device="cpu", max_model_len=MAX_POSITIONS + 1)


def test_a_prefix_file_of_json_lines_may_hold_blank_lines(tmp_path) -> None:
    path = tmp_path / "prefixes.jsonl"
    path.write_text('"a system prompt"\n\n[1, 2, 3]\n   \n')
    assert load_prefix_file(str(path)) == ["a system prompt", [1, 2, 3]]
    listed = tmp_path / "prefixes.json"
    listed.write_text(json.dumps(["x", [4, 5]]))
    assert load_prefix_file(str(listed)) == ["x", [4, 5]]


@pytest.mark.parametrize("content", ["[1, 2]", '["ok", {"prompt": "no"}]', '"ok"\n3\n'])
def test_a_prefix_file_of_anything_but_prompts_is_a_value_error_naming_it(tmp_path, content) -> None:
    path = tmp_path / "prefixes.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="prefixes.json"):
        load_prefix_file(str(path))


def test_auto_dtype_is_float32_on_cpu_and_half_precision_on_cuda(llama_dir, tmp_path) -> None:
    """As vLLM: "auto" serves the checkpoint's dtype, a float32 one in bf16 on the GPU; on the CPU always float32
    (no device is touched: the config only names it)."""
    config = json.loads((Path(llama_dir) / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps(config))
    bf16_dir = str(tmp_path)
    want = {
        (llama_dir, "cpu"): (torch.float32, "torch"),
        (llama_dir, "cuda"): (torch.bfloat16, "triton"),
        (bf16_dir, "cpu"): (torch.float32, "torch"),
        (bf16_dir, "cuda"): (torch.bfloat16, "triton"),
    }
    for (model, device), (dtype, backend) in want.items():
        got, _ = make_engine_config(model, device=device, load_format="dummy")
        assert (got.dtype, got.attention_backend) == (dtype, backend), (model, device)


def test_a_prefix_file_is_pinned_after_the_listed_prefixes(llama_dir, tmp_path) -> None:
    path = tmp_path / "prefixes.json"
    path.write_text(json.dumps([list(range(30, 35))]))
    llm = LLM(
        llama_dir,
        device="cpu",
        block_size=4,
        pinned_prefixes=[list(range(20, 29))],
        pin_prefix_file=str(path),
    )
    assert llm.pinned_tokens == [8, 4]
    assert len(llm.engine.core.kv.pool.pinned) == 3
