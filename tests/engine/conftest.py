from __future__ import annotations

import shutil

import pytest

from roseinfer import LLM
from tests.models.tiny_models import save_hf_model


@pytest.fixture(scope="session")
def model_with_tokenizer(hf_tokenizer_dir, tmp_path_factory) -> str:
    """A tiny random Llama whose vocabulary is the locally trained tokenizer's."""
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(hf_tokenizer_dir))
    directory = tmp_path_factory.mktemp("llama-with-tokenizer")
    save_hf_model("llama", directory, vocab_size=vocab, bos_token_id=0, eos_token_id=0)
    for f in hf_tokenizer_dir.iterdir():
        shutil.copy(f, directory / f.name)
    return str(directory)


@pytest.fixture(scope="session")
def llm(model_with_tokenizer) -> LLM:
    return LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=2048)
