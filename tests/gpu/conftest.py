"""What the GPU engine tests share: the `model_dir` fixture (each tiny model saved in HF format once a module)
and `free_gpu` between engines."""

from __future__ import annotations

import gc

import pytest
import torch

from tests.models.tiny_models import TINY_CONFIGS, save_hf_model


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
