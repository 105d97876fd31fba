"""A tokenizer whose decoder puts a space between tokens (WordPiece's), trained locally, with added tokens both
special and not: where `spaces_between_special_tokens` shows. And the text a stream should have, from whole
decodes of HF's tokenizer (`expected_text`)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "<a>", "<b>"]
PLAIN_ADDED = "<extra>"  # an added token that is not special: skip_special_tokens keeps it
_CORPUS = [
    "hello world the quick brown fox jumps over the lazy dog",
    "greeting answering streaming tokens engine schedules requests",
]


def save_wordpiece_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """Trains the tokenizer, saves it as a HF tokenizer directory and returns it as loaded from there."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(cleanup=False)
    trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(_CORPUS * 5, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        additional_special_tokens=["<a>", "<b>"],
        clean_up_tokenization_spaces=False,
    )
    hf.add_tokens([PLAIN_ADDED])
    hf.save_pretrained(str(directory))
    return AutoTokenizer.from_pretrained(str(directory))


def added_ids(tok: PreTrainedTokenizerBase) -> set[int]:
    return {tok.convert_tokens_to_ids(t) for t in [*SPECIALS, PLAIN_ADDED]}


def expected_text(
    tok: PreTrainedTokenizerBase, prompt: list[int], out: list[int], skip: bool, spaces: bool
) -> str:
    """The output's text from whole decodes: the prompt and output decoded together, less the prompt's text.
    With special tokens kept and `spaces=False` the output is cut wherever two added tokens meet and each
    later piece decoded alone, so nothing comes between the two (vLLM's rule; HF decodes have no such flag)."""

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=skip)

    added = added_ids(tok)
    cuts = [] if skip or spaces else [i for i in range(1, len(out)) if {out[i - 1], out[i]} <= added]
    bounds = [0, *cuts, len(out)]
    text = decode(prompt + out[: bounds[1]])[len(decode(prompt)) :]
    return text + "".join(decode(out[a:b]) for a, b in zip(bounds[1:], bounds[2:]))
