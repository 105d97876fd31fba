from __future__ import annotations

import pytest

from tests.models.tiny_models import TINY_CONFIGS, save_hf_model


@pytest.fixture(scope="session", params=sorted(TINY_CONFIGS))
def hf_model(request, tmp_path_factory):
    """(arch, HF model, directory holding its config.json + safetensors)."""
    arch = request.param
    directory = tmp_path_factory.mktemp(f"hf-{arch}")
    model = save_hf_model(arch, directory)
    return arch, model, str(directory)
