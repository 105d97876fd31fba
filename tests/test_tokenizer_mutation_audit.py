"""Mutation audit (tokenizer.py, the wrapper): which strings go to the hub as ids and which are refused as
missing paths, loader failures named by path, and chat-template ids in whatever shape transformers returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

import roseinfer.tokenizer as tokenizer_module
from roseinfer.tokenizer import apply_chat_template, load_tokenizer


class _Hub:
    """Stands in for AutoTokenizer: records what it was asked to load, then answers with `answer`."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[str, bool]] = []

    def from_pretrained(self, source: str, trust_remote_code: bool = False) -> Any:
        self.calls.append((source, trust_remote_code))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.fixture
def real_tok(hf_tokenizer_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(hf_tokenizer_dir))


def _hub(monkeypatch: pytest.MonkeyPatch, answer: Any) -> _Hub:
    hub = _Hub(answer)
    monkeypatch.setattr(tokenizer_module, "AutoTokenizer", hub)
    return hub


@pytest.mark.parametrize("hub_id", ["gpt2", "Qwen/Qwen2.5-0.5B-Instruct", "org/name.v2"])
def test_hub_ids_reach_the_loader_as_they_are(monkeypatch, tmp_path, real_tok, hub_id):
    monkeypatch.chdir(tmp_path)  # no local directory of that name
    hub = _hub(monkeypatch, real_tok)
    assert load_tokenizer(hub_id, trust_remote_code=True) is real_tok
    assert hub.calls == [(hub_id, True)]


@pytest.mark.parametrize(
    "path",
    ["~/no-such-model-dir", "./no-such-dir", "../no-such-dir", "a/b/c", "models\\llama", "/no/such/dir"],
)
def test_strings_that_can_only_be_paths_are_refused_without_asking_the_hub(monkeypatch, tmp_path, path):
    monkeypatch.chdir(tmp_path)
    hub = _hub(monkeypatch, AssertionError("the hub was asked"))
    with pytest.raises(ValueError, match="does not exist") as info:
        load_tokenizer(path)
    assert repr(path) in str(info.value)
    assert hub.calls == []


@pytest.mark.parametrize("error", [OSError("gone"), ValueError("bad json"), KeyError("model_type")])
def test_a_loader_failure_is_a_value_error_naming_the_source(monkeypatch, tmp_path, error):
    monkeypatch.chdir(tmp_path)
    _hub(monkeypatch, error)
    with pytest.raises(ValueError, match="Could not load a tokenizer from 'org/model'"):
        load_tokenizer("org/model")


def test_something_that_is_not_a_tokenizer_is_refused(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    _hub(monkeypatch, object())
    with pytest.raises(ValueError, match="'org/model' did not yield a tokenizer"):
        load_tokenizer("org/model")


class _ShapedChat:
    """A tokenizer whose apply_chat_template answers in another shape (a dict, a batch of one), as some
    transformers versions and tokenizers do."""

    def __init__(self, tok: PreTrainedTokenizerBase, shape: str) -> None:
        self.tok, self.shape = tok, shape
        self.chat_template = tok.chat_template

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        prompt = kwargs["add_generation_prompt"]
        ids = self.tok.apply_chat_template(messages, add_generation_prompt=prompt, return_dict=False)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)} if self.shape == "dict" else [ids]


@pytest.mark.parametrize("shape", ["dict", "batch"])
def test_chat_template_ids_come_back_flat_whatever_the_shape(real_tok, shape):
    messages = [{"role": "user", "content": "hi there"}]
    want = real_tok.encode(
        "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    assert apply_chat_template(_ShapedChat(real_tok, shape), messages) == want  # type: ignore[arg-type]
