"""Find a model (local HF directory, built-in shape, or hub id) and build it with real or dummy weights."""

from __future__ import annotations

import gc
import glob
import json
import os
import zlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from roseinfer.config import ModelConfig
from roseinfer.models.registry import model_class

BUILTIN_CONFIG_DIR = os.path.join(os.path.dirname(__file__), "configs")
DEFAULT_MODEL = "tiny-llama"


def builtin_shapes() -> list[str]:
    return sorted(f.removesuffix(".json") for f in os.listdir(BUILTIN_CONFIG_DIR) if f.endswith(".json"))


def resolve_model_path(model: str, need_weights: bool) -> str:
    """Return a local directory or config.json path for `model`.

    Accepts a directory with config.json, a config.json file, a built-in shape id (dummy weights only),
    or a hub id, which is downloaded when the network allows it.
    """
    if os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise ValueError(f"model directory {model!r} has no config.json")
        return model
    if os.path.isfile(model):
        if need_weights:
            raise ValueError(
                f"{model!r} is a config file: it holds no weights; use load_format='dummy' (--load-format dummy)"
            )
        return model
    builtin = os.path.join(BUILTIN_CONFIG_DIR, f"{model}.json")
    if os.path.isfile(builtin):
        if need_weights:
            raise ValueError(
                f"{model!r} is a built-in shape without weights; use load_format='dummy' (--load-format dummy)"
            )
        return builtin
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.safetensors", "*.model", "*.txt"] if need_weights else ["*.json"]
        return snapshot_download(model, allow_patterns=patterns)
    except Exception as e:  # network errors, unknown repo, gated repo...
        raise ValueError(
            f"model {model!r} is not a local directory, a config file or a built-in shape "
            f"({', '.join(builtin_shapes())}), and the hub could not provide it: {e}"
        ) from e


def safetensors_weights(model_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(model_dir, f) for f in files]
    else:
        files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        if glob.glob(os.path.join(model_dir, "*.bin")):
            raise ValueError(
                f"{model_dir!r} holds PyTorch *.bin weights; roseinfer loads safetensors only (re-save the "
                "model with transformers' save_pretrained(..., safe_serialization=True))"
            )
        raise ValueError(
            f"no *.safetensors weights in {model_dir!r} (use load_format='dummy', --load-format dummy, for random weights)"
        )
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, f.get_tensor(name)


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in weights:
        try:
            filled = model.load_weight(params, name, tensor)
        except KeyError as e:
            raise ValueError(f"checkpoint tensor {name!r} has no place in {type(model).__name__}") from e
        if filled is not None:
            loaded.add(filled)
    missing = model.expected_weights(params) - loaded
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} weights, e.g. {sorted(missing)[:5]}")


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Deterministic random weights: each parameter's values depend only on its name, shape and seed."""
    for name, p in model.named_parameters():
        g = torch.Generator(device=p.device)
        g.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        is_norm = "norm" in name or ".ln_" in name or name.startswith("ln_")
        if is_norm and name.endswith("weight"):
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.normal_(0.0, 0.02, generator=g) if not is_norm else p.zero_()
        else:
            p.normal_(0.0, 0.02, generator=g)


def build_model(
    cfg: ModelConfig,
    path: str,
    load_format: str,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
    seed: int = 0,
) -> nn.Module:
    cls = model_class(cfg)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = cls(cfg, max_positions)
    finally:
        torch.set_default_dtype(old)
    # A process's first meta-device build makes torch import torch._dynamo, whose imports leave a garbage
    # traceback cycle holding every frame on the stack: the caller's engine would outlive its owner.
    gc.collect()
    model.to_empty(device=device)
    model.tie_weights()  # to_empty gives each name its own storage
    if load_format == "dummy":
        init_dummy_weights(model, seed)
    elif load_format in ("auto", "safetensors"):
        load_weights(model, safetensors_weights(path))
    else:
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    model.build_buffers(device)
    return model.eval()
