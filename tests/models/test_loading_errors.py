"""Checkpoints and configs roseinfer cannot run are refused with an error that names what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from roseinfer import LLM


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
