"""Shared pytest fixtures and hooks for the roseinfer test suite."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

# Without CUDA, Triton kernels run in its CPU interpreter. Triton reads this when a kernel is defined, and
# roseinfer.models imports the kernels, so it is set here, before any test module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# ---------------------------------------------------------------------------
# Hooks
# ---------------------------------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` when no CUDA device is present, and tests marked ``interpreter`` when one is
    (the two allowed conditional skips): Triton runs its kernels on CPU tensors only in its interpreter, which
    is off wherever CUDA is."""
    if torch.cuda.is_available():
        skip, marker = (
            pytest.mark.skip(reason="Triton on CPU tensors needs its interpreter (no CUDA)"),
            "interpreter",
        )
    else:
        skip, marker = pytest.mark.skip(reason="needs a CUDA GPU"), "gpu"
    for item in items:
        if item.get_closest_marker(marker) is not None:
            item.add_marker(skip)


# ---------------------------------------------------------------------------
# Invariants after every step
# ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def check_invariants_every_step(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every scheduler and engine a test steps checks the invariants (tests/invariants.py): after each
    schedule(), before the step's KV writes, each written block's writer holds it alone; after each engine
    step or abort, finished requests hold nothing and an idle engine nothing but its pins. A test that breaks
    the engine's state on purpose opts out with `@pytest.mark.no_invariant_hook`. `gpu` tests are left out:
    the checks walk the whole pool every step, which holds millions of blocks where an engine sizes its cache
    by `gpu_memory_utilization`, and the scheduler they check runs the same on CPU."""
    node = request.node
    if node.get_closest_marker("no_invariant_hook") is not None or node.get_closest_marker("gpu") is not None:
        return
    from roseinfer.engine.core import EngineCore
    from roseinfer.engine.llm_engine import LLMEngine
    from roseinfer.scheduler.scheduler import Scheduler
    from tests import invariants

    schedule, core_step = Scheduler.schedule, EngineCore.step
    engine_step, abort = LLMEngine.step, LLMEngine.abort_request

    def checked_schedule(self: Scheduler) -> Any:
        out = schedule(self)
        invariants.check_scheduled(self, out)
        return out

    def checked_core_step(self: EngineCore) -> Any:
        got, finished = core_step(self)
        invariants.check_holds_nothing(self, finished)
        invariants.check_core(self)
        return got, finished

    def checked_engine_step(self: LLMEngine, final_only: bool = False) -> Any:
        outputs = engine_step(self, final_only)
        invariants.check_engine(self)
        return outputs

    def checked_abort(self: LLMEngine, request_id: Any) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        roots = [group.root for rid in ids if (group := self.groups.get(rid)) is not None]
        abort(self, ids)
        invariants.check_aborted(self, roots)
        invariants.check_engine(self)

    monkeypatch.setattr(Scheduler, "schedule", checked_schedule)
    monkeypatch.setattr(EngineCore, "step", checked_core_step)
    monkeypatch.setattr(LLMEngine, "step", checked_engine_step)
    monkeypatch.setattr(LLMEngine, "abort_request", checked_abort)


# ---------------------------------------------------------------------------
# Tokenizer fixture
# ---------------------------------------------------------------------------

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_TRAIN_TEXT_EN = (
    "The quick brown fox jumps over the lazy dog. "
    "An inference engine schedules requests, batches them, and streams tokens back to the user. "
    "Paged attention stores the key value cache in fixed size blocks so memory is not wasted. "
    "Hello world! How are you doing today? I am fine, thank you very much. "
    "Numbers like 12345, 3.14159 and 2024-06-01 also show up in real text. "
)
_TRAIN_TEXT_ZH = (
    "大语言模型推理引擎需要高效地管理显存。"
    "你好，世界！今天天气很好，我们一起去公园散步吧。"
    "注意力机制是变换器模型的核心组成部分。"
    "中文字符在UTF-8编码中通常占用三个字节。"
)
_TRAIN_TEXT_EMOJI = "Emoji test 😀 😃 🚀 🎉 👍🏽 ❤️ 🇨🇳 👨‍👩‍👧 🤖 done. "

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _training_corpus() -> list[str]:
    base = [_TRAIN_TEXT_EN, _TRAIN_TEXT_ZH, _TRAIN_TEXT_EMOJI]
    # A few KB in total; repetition lets BPE learn merges, including some multi-byte ones.
    return [text for _ in range(8) for text in base]


@pytest.fixture(scope="session")
def hf_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Train a tiny byte-level BPE tokenizer (ChatML template) and save it as a HF tokenizer dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token=None,
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    hf_tok.chat_template = CHATML_TEMPLATE
    out_dir = tmp_path_factory.mktemp("hf_tokenizer")
    hf_tok.save_pretrained(str(out_dir))
    return out_dir


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Llama in HF format (no tokenizer)."""
    from tests.models.tiny_models import save_hf_model

    directory = tmp_path_factory.mktemp("llama")
    save_hf_model("llama", directory)
    return str(directory)


@pytest.fixture(scope="session")
def model_with_tokenizer(hf_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Llama whose vocabulary is the locally trained tokenizer's."""
    import shutil

    from transformers import AutoTokenizer

    from tests.models.tiny_models import save_hf_model

    vocab = len(AutoTokenizer.from_pretrained(hf_tokenizer_dir))
    directory = tmp_path_factory.mktemp("llama-with-tokenizer")
    save_hf_model("llama", directory, vocab_size=vocab, bos_token_id=0, eos_token_id=0)
    for f in hf_tokenizer_dir.iterdir():
        shutil.copy(f, directory / f.name)
    return str(directory)
