from __future__ import annotations

import pytest

from roseinfer import LLM


@pytest.fixture(scope="session")
def llm(model_with_tokenizer) -> LLM:
    return LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=2048)
