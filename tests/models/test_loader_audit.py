"""Mutation audit (models/loader.py): sharded checkpoints load every shard, a checkpoint missing a weight is
refused by name, dummy weights follow the engine seed, building a model leaves torch's default dtype alone,
and model paths or load formats that cannot give weights are ValueErrors naming the problem."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from roseinfer import LLM, SamplingParams
from roseinfer.models.loader import BUILTIN_CONFIG_DIR, DEFAULT_MODEL
from tests.models.test_config_fields import load, relative_error
from tests.models.tiny_models import save_hf_model


def test_a_sharded_checkpoint_loads_every_shard(tmp_path: Path) -> None:
    model = save_hf_model("llama", tmp_path)
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    assert relative_error(load(tmp_path), model, list(range(3, 30))) < 1e-4


def test_a_checkpoint_missing_a_weight_is_refused_by_name(tmp_path: Path) -> None:
    save_hf_model("llama", tmp_path)
    (file,) = tmp_path.glob("*.safetensors")
    tensors = load_file(file)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"checkpoint is missing 1 weights, e.g. \[.*up_proj"):
        load(tmp_path)


def greedy_ids(llm: LLM) -> list[int]:
    sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    return llm.generate([[1, 2, 3, 4]], sp, use_tqdm=False)[0].outputs[0].token_ids


def test_dummy_weights_follow_the_engine_seed() -> None:
    def weights(seed: int) -> torch.Tensor:
        llm = LLM(DEFAULT_MODEL, load_format="dummy", device="cpu", cpu_kv_tokens=256, seed=seed)
        return next(llm.engine.core.runner.model.parameters()).detach().clone()

    assert torch.equal(weights(0), weights(0))
    assert not torch.equal(weights(0), weights(1))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_building_a_model_leaves_the_default_dtype_alone(dtype: str) -> None:
    before = torch.get_default_dtype()
    llm = LLM(DEFAULT_MODEL, load_format="dummy", device="cpu", dtype=dtype, cpu_kv_tokens=256)
    assert next(llm.engine.core.runner.model.parameters()).dtype == getattr(torch, dtype)
    assert torch.get_default_dtype() == before
    assert torch.tensor([1.0]).dtype == before


def test_load_formats(llama_dir: str) -> None:
    """ "safetensors" (as vLLM) loads the checkpoint as "auto" does; anything else is refused by name."""
    assert greedy_ids(
        LLM(llama_dir, load_format="safetensors", device="cpu", cpu_kv_tokens=256)
    ) == greedy_ids(LLM(llama_dir, device="cpu", cpu_kv_tokens=256))
    with pytest.raises(ValueError, match="load_format must be 'auto' or 'dummy', got 'pt'"):
        LLM(llama_dir, load_format="pt", device="cpu", cpu_kv_tokens=256)


def test_paths_that_hold_no_weights_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        LLM(str(tmp_path / "empty"), load_format="dummy", device="cpu")
    config = str(Path(BUILTIN_CONFIG_DIR) / "tiny-llama.json")
    with pytest.raises(ValueError, match="is a config file: it holds no weights"):
        LLM(config, device="cpu")
    with pytest.raises(ValueError, match="is a built-in shape without weights"):
        LLM(DEFAULT_MODEL, device="cpu")
    assert len(greedy_ids(LLM(config, load_format="dummy", device="cpu", cpu_kv_tokens=256))) == 8
