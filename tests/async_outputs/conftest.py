from __future__ import annotations

import shutil

import pytest

from tests.models.tiny_models import save_hf_model


@pytest.fixture(scope="session")
def tok_model_dir(hf_tokenizer_dir, tmp_path_factory) -> str:
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(hf_tokenizer_dir))
    directory = tmp_path_factory.mktemp("review-llama-tok")
    save_hf_model("llama", directory, vocab_size=vocab, bos_token_id=0, eos_token_id=0)
    for f in hf_tokenizer_dir.iterdir():
        shutil.copy(f, directory / f.name)
    return str(directory)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("review-llama")
    save_hf_model("llama", directory)
    return str(directory)
