"""Mutation audit (config.py): `ModelConfig`'s derived sizes against the HF transformers model built from the
same config (its weight shapes are the reference), for configs that spell every field out (what transformers 5
saves) and for older ones that leave the defaults implicit (no num_key_value_heads, head_dim or n_inner); the
KV bytes a token costs against the cache the engine allocates."""

from __future__ import annotations

import re

import pytest
import torch
import transformers

from roseinfer import LLM
from roseinfer.config import ModelConfig, parse_dtype
from roseinfer.models.loader import DEFAULT_MODEL
from tests.models.tiny_models import TINY_CONFIGS, make_hf_model


def hf_reference(arch: str, implicit: bool):
    """The HF model, and its config as a dict; with `implicit`, the fields older configs leave out dropped
    where HF's config class, reading the dict without them, takes the model's value anyway (llama's kv heads =
    heads; head_dim = hidden / heads except Qwen3's 128; 4 x hidden MLP and GPT-2's embeddings tied). Mistral's
    and Qwen's kv-head defaults (8, 32) exceed the tiny models' heads: those keys stay."""
    overrides = {}
    if implicit and arch == "llama":
        overrides["num_key_value_heads"] = TINY_CONFIGS[arch]["num_attention_heads"]
    model = make_hf_model(arch, **overrides)
    cfg = model.config.to_dict()
    if implicit:
        for key in ("num_key_value_heads", "head_dim"):
            if key in cfg and _hf_default_matches(cfg, key):
                cfg.pop(key)
        if arch == "gpt2":
            cfg.pop("n_inner", None)
            cfg.pop("tie_word_embeddings", None)
    return model, cfg


def _hf_default_matches(cfg: dict, key: str) -> bool:
    """Whether HF's config class for `cfg` gives `key` the same value with the key left out."""
    rest = {
        k: v for k, v in cfg.items() if k not in (key, "model_type", "architectures", "transformers_version")
    }
    default = getattr(transformers.AutoConfig.for_model(cfg["model_type"], **rest), key, None)
    return default == cfg[key] or (key == "head_dim" and default is None and cfg[key] == _split(cfg))


def _split(cfg: dict) -> int:
    return cfg["hidden_size"] // cfg["num_attention_heads"]


@pytest.mark.parametrize("implicit", [False, True], ids=["explicit", "implicit"])
@pytest.mark.parametrize("arch", sorted(TINY_CONFIGS))
def test_derived_sizes_match_the_hf_model(arch, implicit):
    model, cfg_dict = hf_reference(arch, implicit)
    cfg = ModelConfig.from_dict(cfg_dict)
    # named_parameters lists a tied lm_head once (as the embedding); position embeddings are no matmul
    matrices = {n: p for n, p in model.named_parameters() if p.dim() == 2 and "wpe" not in n}
    layer0 = [p.numel() for n, p in matrices.items() if re.search(r"\.(h|layers)\.0\.", n)]
    assert cfg.layer_params() == sum(layer0)
    assert cfg.params_count() == sum(p.numel() for p in matrices.values())
    params = dict(model.named_parameters())
    if arch == "gpt2":
        q_width = kv_width = params["transformer.h.0.attn.c_attn.weight"].shape[1] // 3
        mlp = params["transformer.h.0.mlp.c_fc.weight"].shape[1]
        tied = "lm_head.weight" not in params
    else:
        q_width = params["model.layers.0.self_attn.q_proj.weight"].shape[0]
        kv_width = params["model.layers.0.self_attn.k_proj.weight"].shape[0]
        mlp = params["model.layers.0.mlp.up_proj.weight"].shape[0]
        tied = "lm_head.weight" not in params
    assert (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim) == (q_width, kv_width)
    assert cfg.intermediate_size == mlp
    assert cfg.tie_word_embeddings == tied


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_bytes_per_token_is_what_the_cache_holds(llama_dir, dtype):
    """The KV cache the engine allocates is num_blocks x block_size tokens of `kv_bytes_per_token` each, the
    figure that sizes the GPU cache from free memory."""
    llm = LLM(llama_dir, device="cpu", dtype=dtype, block_size=8, cpu_kv_tokens=128)
    runner = llm.engine.core.runner
    cache = runner.kv_cache
    cfg = llm.engine.model_config
    per_token = cfg.kv_bytes_per_token(cache.dtype)
    assert cache.numel() * cache.element_size() == llm.engine.core.num_blocks * 8 * per_token
    assert runner.block_bytes() == 8 * per_token


@pytest.mark.parametrize(
    "name, want",
    [
        ("float32", torch.float),
        ("fp32", torch.float),
        ("float", torch.float),
        ("float16", torch.half),
        ("fp16", torch.half),
        ("half", torch.half),
        ("bfloat16", torch.bfloat16),
        ("bf16", torch.bfloat16),
    ],
)
def test_dtype_names_are_torch_s(name, want):
    """Each name means what torch's alias of that name means (torch.float is float32, torch.half float16); a
    torch.dtype is taken as is, as vLLM takes it."""
    assert parse_dtype(name) is want
    assert parse_dtype(want) is want


def test_an_engine_takes_a_torch_dtype_and_refuses_an_unknown_name():
    llm = LLM(DEFAULT_MODEL, load_format="dummy", device="cpu", dtype=torch.bfloat16, cpu_kv_tokens=128)
    assert llm.engine.config.dtype is torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of"):
        parse_dtype("float64")
