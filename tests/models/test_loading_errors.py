"""Checkpoints and configs roseinfer cannot run are refused with an error that names what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roseinfer import LLM
from tests.models.tiny_models import save_hf_model


@pytest.mark.parametrize(
    "model_type, fields",
    [
        ("falcon", {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100}),
        ("t5", {"d_model": 64, "num_heads": 4, "num_layers": 2, "vocab_size": 100}),
    ],
)
def test_an_unsupported_architecture_is_refused_by_name(
    tmp_path: Path, model_type: str, fields: dict
) -> None:
    from transformers import AutoConfig

    AutoConfig.for_model(model_type, **fields).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"is not supported; supported: .*LlamaForCausalLM"):
        LLM(str(tmp_path), load_format="dummy", device="cpu", dtype="float32", cpu_kv_tokens=256)


@pytest.mark.parametrize(
    "arch, field, value, tensor",
    [
        ("llama", "intermediate_size", 96, "model.layers.0.mlp.down_proj.weight"),
        ("llama", "num_key_value_heads", 1, "model.layers.0.self_attn.k_proj.weight"),
        ("gpt2", "vocab_size", 400, "wte.weight"),
    ],
)
def test_a_config_that_does_not_match_the_weights_names_the_tensor(
    tmp_path: Path, arch: str, field: str, value: int, tensor: str
) -> None:
    save_hf_model(arch, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"checkpoint tensor '{tensor}' has shape .* expects"):
        LLM(str(tmp_path), device="cpu", dtype="float32", cpu_kv_tokens=256)


@pytest.mark.parametrize("broken", ["config.json", "generation_config.json"])
def test_a_corrupt_config_file_is_named(tmp_path: Path, broken: str) -> None:
    save_hf_model("llama", tmp_path)
    path = tmp_path / broken
    path.write_text(path.read_text()[:40])  # a truncated download
    with pytest.raises(ValueError, match=rf"{broken} is not valid JSON"):
        LLM(str(tmp_path), load_format="dummy", device="cpu", dtype="float32", cpu_kv_tokens=256)


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
@pytest.mark.parametrize("flag", ["attention_bias", "mlp_bias"])
def test_biases_roseinfer_has_no_place_for_are_refused_by_name(model_type: str, flag: str) -> None:
    """HF's attention_bias puts a bias on o_proj too, and mlp_bias on every MLP projection: dummy weights used
    to build a model without them, silently unlike HF."""
    from roseinfer.config import ModelConfig

    cfg = {
        "architectures": ["LlamaForCausalLM" if model_type == "llama" else "Qwen3ForCausalLM"],
        "model_type": model_type, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
        "intermediate_size": 128, "vocab_size": 100, flag: True,
    }  # fmt: skip
    with pytest.raises(ValueError, match=flag):
        ModelConfig.from_dict(cfg)
    with pytest.raises(ValueError, match=flag):  # named by its architecture alone
        ModelConfig.from_dict({k: v for k, v in cfg.items() if k != "model_type"})
    ModelConfig.from_dict({**cfg, flag: False})


def test_a_bin_only_checkpoint_is_named_as_such(tmp_path: Path) -> None:
    """Its error used to suggest random weights to someone who has real ones."""
    import torch

    from tests.models.tiny_models import make_hf_model

    model = make_hf_model("llama")  # transformers 5 writes safetensors only: the .bin is torch.save's
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    assert list(tmp_path.glob("*.bin")) and not list(tmp_path.glob("*.safetensors"))
    with pytest.raises(ValueError, match=r"\*\.bin weights; roseinfer loads safetensors only"):
        LLM(str(tmp_path), device="cpu", dtype="float32", cpu_kv_tokens=256)
