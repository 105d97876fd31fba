from __future__ import annotations

import pytest

from tests.models.tiny_models import save_hf_model


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("kv-llama")
    save_hf_model("llama", directory)
    return str(directory)
