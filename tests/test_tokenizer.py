from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from roseinfer.tokenizer import IncrementalDetokenizer, apply_chat_template, load_tokenizer

FFFD = "\ufffd"
MIXED_TEXT = "Hello world! 你好，世界。Streaming 🚀 tokens 😀 back: 注意力机制 👍🏽 done."


@pytest.fixture(scope="module")
def tok(hf_tokenizer_dir: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(str(hf_tokenizer_dir))


def encode(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def stream(det: IncrementalDetokenizer, ids: list[int], chunk_sizes: list[int] | None = None) -> list[str]:
    """Feed ``ids`` to ``det`` (one token at a time unless chunk sizes are given); return all deltas + flush."""
    deltas: list[str] = []
    i = 0
    sizes = iter(chunk_sizes or [])
    while i < len(ids):
        k = next(sizes, 1)
        deltas.append(det.add(ids[i : i + k]))
        i += k
    deltas.append(det.flush())
    return deltas


def split_char_ids(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text``, asserting that at least one multi-byte character is split across tokens."""
    ids = encode(tok, text)
    assert any(FFFD in tok.decode([i]) for i in ids), f"expected {text!r} to split a character across tokens"
    return ids


# ---------------------------------------------------------------------------------------------------------
# load_tokenizer
# ---------------------------------------------------------------------------------------------------------


def test_load_tokenizer_from_dir(hf_tokenizer_dir: Path, tok: PreTrainedTokenizerBase) -> None:
    assert isinstance(tok, PreTrainedTokenizerBase)
    assert tok.eos_token == "<|endoftext|>"
    assert tok.bos_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids("<|im_start|>") != tok.unk_token_id
    assert tok.decode(encode(tok, MIXED_TEXT)) == MIXED_TEXT
    # a pathlib-ish string with a trailing slash also works
    assert len(load_tokenizer(str(hf_tokenizer_dir) + "/")) == len(tok)


def test_load_tokenizer_missing_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "such" / "model")
    with pytest.raises(ValueError, match="does not exist") as info:
        load_tokenizer(missing)
    assert missing in str(info.value)


def test_load_tokenizer_dir_without_tokenizer(tmp_path: Path) -> None:
    empty = tmp_path / "empty_model_dir"
    empty.mkdir()
    with pytest.raises(ValueError) as info:
        load_tokenizer(str(empty))
    assert str(empty) in str(info.value)


def test_load_tokenizer_file_path(hf_tokenizer_dir: Path) -> None:
    path = str(hf_tokenizer_dir / "tokenizer.json")
    with pytest.raises(ValueError, match="expected a tokenizer directory") as info:
        load_tokenizer(path)
    assert path in str(info.value)


# ---------------------------------------------------------------------------------------------------------
# apply_chat_template
# ---------------------------------------------------------------------------------------------------------


def test_apply_chat_template_ids(tok: PreTrainedTokenizerBase) -> None:
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "你好 🚀"},
    ]
    ids = apply_chat_template(tok, messages)
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    expected = (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\n你好 🚀<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.decode(ids) == expected
    assert ids == encode(tok, expected)
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert ids[0] == im_start


def test_apply_chat_template_without_generation_prompt(tok: PreTrainedTokenizerBase) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with_prompt = apply_chat_template(tok, messages, add_generation_prompt=True)
    without = apply_chat_template(tok, messages, add_generation_prompt=False)
    assert tok.decode(without) == "<|im_start|>user\nhi<|im_end|>\n"
    assert with_prompt[: len(without)] == without
    assert tok.decode(with_prompt[len(without) :]) == "<|im_start|>assistant\n"


def test_apply_chat_template_missing_template(hf_tokenizer_dir: Path) -> None:
    bare = load_tokenizer(str(hf_tokenizer_dir))
    bare.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        apply_chat_template(bare, [{"role": "user", "content": "hi"}])


# ---------------------------------------------------------------------------------------------------------
# IncrementalDetokenizer
# ---------------------------------------------------------------------------------------------------------


def test_detokenizer_ascii_token_by_token(tok: PreTrainedTokenizerBase) -> None:
    text = "The quick brown fox jumps over the lazy dog, 12345 times."
    ids = encode(tok, text)
    det = IncrementalDetokenizer(tok, [])
    deltas = stream(det, ids)
    assert "".join(deltas) == text == det.text
    assert deltas[-1] == ""  # nothing held back for ASCII
    assert sum(1 for d in deltas if d) == len(ids)  # every ASCII token yields text immediately


@pytest.mark.parametrize("text", ["世界和平", "注意力机制很重要", "火箭🚀", "👍🏽👨‍👩‍👧🇨🇳", MIXED_TEXT])
def test_detokenizer_multibyte_never_broken(tok: PreTrainedTokenizerBase, text: str) -> None:
    ids = split_char_ids(tok, text) if text != MIXED_TEXT else encode(tok, text)
    det = IncrementalDetokenizer(tok, [])
    deltas = stream(det, ids)
    assert all(FFFD not in d for d in deltas), deltas
    assert "".join(deltas) == text == det.text
    assert det.num_pending_tokens == 0


def test_detokenizer_holds_back_partial_character(tok: PreTrainedTokenizerBase) -> None:
    ids = split_char_ids(tok, "🚀")
    assert len(ids) >= 2
    det = IncrementalDetokenizer(tok, encode(tok, "rocket: "))
    for i in ids[:-1]:
        assert det.add([i]) == ""
    assert det.text == ""
    assert det.num_pending_tokens == len(ids) - 1
    assert det.add(ids[-1:]) == "🚀"
    assert det.text == "🚀"
    assert det.flush() == ""


def test_detokenizer_chinese_emoji_chunked(tok: PreTrainedTokenizerBase) -> None:
    ids = encode(tok, MIXED_TEXT)
    for chunk in (2, 3, 7, len(ids)):
        det = IncrementalDetokenizer(tok, [])
        deltas = stream(det, ids, [chunk] * len(ids))
        assert "".join(deltas) == MIXED_TEXT
        assert all(FFFD not in d for d in deltas)


def test_detokenizer_flush_emits_incomplete_tail(tok: PreTrainedTokenizerBase) -> None:
    rocket = split_char_ids(tok, "🚀")
    ids = encode(tok, "go ") + rocket[:-1]
    det = IncrementalDetokenizer(tok, [])
    deltas = [det.add([i]) for i in ids]
    assert "".join(deltas) == "go "  # the partial emoji is held back
    tail = det.flush()
    assert tail and tail.endswith(FFFD)
    assert det.text == "go " + tail == tok.decode(ids)
    assert det.flush() == ""  # idempotent
    assert det.num_pending_tokens == 0


def test_detokenizer_skips_special_tokens(tok: PreTrainedTokenizerBase) -> None:
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    eos = tok.eos_token_id
    ids = encode(tok, "你好 world") + [im_end] + encode(tok, "! 🚀") + [eos]

    det = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    assert "".join(stream(det, ids)) == "你好 world! 🚀" == tok.decode(ids, skip_special_tokens=True)

    det = IncrementalDetokenizer(tok, [], skip_special_tokens=False)
    out = "".join(stream(det, ids))
    assert out == "你好 world<|im_end|>! 🚀<|endoftext|>" == tok.decode(ids, skip_special_tokens=False)


def test_detokenizer_special_token_inside_split_character(tok: PreTrainedTokenizerBase) -> None:
    rocket = split_char_ids(tok, "🚀")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = rocket[:1] + [im_end] + rocket[1:]
    for skip in (True, False):
        det = IncrementalDetokenizer(tok, [], skip_special_tokens=skip)
        deltas = stream(det, ids)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)
    det = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    assert [det.add([i]) for i in ids][-1] == "🚀"


def test_detokenizer_with_chat_prompt(tok: PreTrainedTokenizerBase) -> None:
    prompt = apply_chat_template(tok, [{"role": "user", "content": "说点什么"}])
    answer = "好的！Here you go 😀🚀"
    ids = encode(tok, answer) + [tok.convert_tokens_to_ids("<|im_end|>")]
    det = IncrementalDetokenizer(tok, prompt)
    assert "".join(stream(det, ids)) == answer
    assert det.output_token_ids == ids
    assert det.text == answer


def test_detokenizer_empty_inputs(tok: PreTrainedTokenizerBase) -> None:
    det = IncrementalDetokenizer(tok, [])
    assert det.add([]) == ""
    assert det.flush() == ""
    assert det.text == ""


def test_detokenizer_decodes_small_windows(tok: PreTrainedTokenizerBase) -> None:
    """Each add() decodes a bounded window, not the whole output so far."""
    window_sizes: list[int] = []

    class Spy:
        def decode(self, ids: list[int], **kwargs: Any) -> str:
            window_sizes.append(len(ids))
            return tok.decode(ids, **kwargs)

    ids = encode(tok, MIXED_TEXT * 20)
    det = IncrementalDetokenizer(Spy(), encode(tok, "prompt " * 50))  # type: ignore[arg-type]
    deltas = stream(det, ids)
    assert "".join(deltas) == MIXED_TEXT * 20
    assert len(ids) > 300
    assert max(window_sizes) <= 16
    assert len(window_sizes) <= 3 * len(ids)


ALPHABET = (
    list("abcxyz ,.!?\n0123")
    + list("你好世界注意力机制中文字符编码")
    + ["😀", "🚀", "🎉", "👍🏽", "❤️", "🤖", "é", "ß", "Ω"]
)


def test_detokenizer_fuzz_random_text(tok: PreTrainedTokenizerBase) -> None:
    rng = random.Random(1234)
    for _ in range(300):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 30)))
        ids = encode(tok, text)
        det = IncrementalDetokenizer(tok, encode(tok, "prefix: 你好"))
        deltas = stream(det, ids, [rng.choice([1, 1, 1, 2, 3, 5]) for _ in ids])
        assert all(FFFD not in d for d in deltas), (text, deltas)
        assert "".join(deltas) == text == det.text


def test_detokenizer_fuzz_random_ids(tok: PreTrainedTokenizerBase) -> None:
    """Arbitrary ids (invalid UTF-8 included): no exception, emitted text is always final, full match."""
    rng = random.Random(20240601)
    vocab = len(tok)
    # Bias towards tokens of non-ASCII bytes so that split / invalid sequences are common.
    non_ascii = [i for i in range(vocab) if FFFD in tok.decode([i])]
    assert len(non_ascii) > 50
    for _ in range(400):
        skip = rng.random() < 0.5
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(0, 6))]
        out = [
            rng.choice(non_ascii) if rng.random() < 0.6 else rng.randrange(vocab)
            for _ in range(rng.randrange(0, 60))
        ]
        final = tok.decode(out, skip_special_tokens=skip)
        det = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
        emitted = ""
        i = 0
        while i < len(out):
            k = rng.choice([1, 1, 1, 2, 4])
            emitted += det.add(out[i : i + k])
            i += k
            # Nothing emitted mid-stream is ever revised: in particular no U+FFFD that a later token completes.
            assert final.startswith(emitted), (skip, prompt, out, emitted, final)
        emitted += det.flush()
        assert emitted == final == det.text


def test_detokenizer_long_invalid_run_stays_bounded(tok: PreTrainedTokenizerBase) -> None:
    """A run of lone UTF-8 lead bytes never completes; it must not be held back (and re-decoded) forever."""
    lead = tok.convert_tokens_to_ids("ä")  # byte 0xE4 on its own: the start of a 3-byte character
    assert tok.decode([lead]) == FFFD
    ids = [lead] * 200 + split_char_ids(tok, "世")
    det = IncrementalDetokenizer(tok, [])
    emitted = ""
    for i in ids:
        emitted += det.add([i])
        assert det.num_pending_tokens <= IncrementalDetokenizer.MAX_PENDING + 1
    assert emitted.endswith(FFFD + "世")
    assert emitted + det.flush() == tok.decode(ids)


# ---------------------------------------------------------------------------------------------------------
# A SentencePiece-like tokenizer (Llama 2 / Mistral style): "▁" for spaces, byte-fallback tokens <0xNN> for
# characters outside the vocabulary, and a decoder that strips the text's one leading space.
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sp_tok() -> PreTrainedTokenizerBase:
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=400, min_frequency=2, special_tokens=specials + byte_tokens, show_progress=False
    )
    tok.train_from_iterator(
        ["Hello world. The quick brown fox jumps over the lazy dog. Great answer."] * 4, trainer
    )
    # As in a real SentencePiece vocabulary, the byte tokens are ordinary tokens, not special ones.
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in specials]
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )


@pytest.mark.parametrize("prompt_text", ["I love 🚀🚀", "Hello 世界", "The fox 🚀"])
def test_detokenizer_keeps_the_first_space_after_byte_fallback_prompt(
    sp_tok: PreTrainedTokenizerBase, prompt_text: str
) -> None:
    """A prompt ending in byte-fallback tokens whose context window starts mid-character (all of that run
    decodes to U+FFFD) must still serve as context: the first output token's leading space is kept."""
    prompt = [sp_tok.bos_token_id] + encode(sp_tok, prompt_text)
    out = encode(sp_tok, "Great answer")
    assert sp_tok.convert_ids_to_tokens(prompt)[-1].startswith("<0x")  # the prompt ends in byte tokens
    want = sp_tok.decode(prompt + out, skip_special_tokens=True)
    assert want == prompt_text + " Great answer"
    det = IncrementalDetokenizer(sp_tok, prompt)
    assert "".join(stream(det, out)) == " Great answer"


@pytest.mark.parametrize("chunk", [2, 3, 5])
def test_detokenizer_chunks_of_byte_fallback_tokens_never_emit_broken_text(
    sp_tok: PreTrainedTokenizerBase, chunk: int
) -> None:
    """Byte fallback decodes a run of byte tokens as one: a complete emoji followed by part of the next one
    decodes to U+FFFD throughout. Chunks that always end mid-emoji must not push such text out as final."""
    text = "Hello 🚀🚀🚀🚀😀😀 world 你好世界"
    ids = encode(sp_tok, text)
    det = IncrementalDetokenizer(sp_tok, [sp_tok.bos_token_id])
    deltas = stream(det, ids, [chunk] * len(ids))
    assert all(FFFD not in d for d in deltas), deltas
    assert "".join(deltas) == text == det.text
