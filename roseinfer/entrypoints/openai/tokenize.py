"""vLLM's `/tokenize` and `/detokenize`: a prompt (text, or chat messages through the chat template) as the
engine's token ids, and ids back as text. The work runs where the engine runs (`call`), with its tokenizer; the
functions here are module-level so that they pickle to an engine process."""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, StrictInt

from roseinfer.engine.llm_engine import LLMEngine, checked_token_ids
from roseinfer.entrypoints.openai.protocol import ChatMessage, OpenAIModel


class TokenizeRequest(OpenAIModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True

    def refuse_unsupported(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt (text) or messages (a chat), not both or neither")


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[StrictInt] = Field(min_length=0)


def _tokenizer(engine: LLMEngine) -> Any:
    if engine.tokenizer is None:
        raise ValueError("this model has no tokenizer")
    return engine.tokenizer


def tokenize(engine: LLMEngine, request: TokenizeRequest) -> dict[str, Any]:
    """`/tokenize`'s body: the ids as a request would get them (the chat template for messages)."""
    from roseinfer.entrypoints.openai.serving import render_chat

    tokenizer = _tokenizer(engine)
    if request.messages is not None:
        messages = [m.template_dict() for m in request.messages]
        ids = render_chat(engine, messages, request.add_generation_prompt)
    else:
        try:
            ids = tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        except (TypeError, UnicodeError) as e:
            raise ValueError(f"prompt text could not be tokenized: {e}") from e
    return {"count": len(ids), "max_model_len": engine.config.max_model_len, "tokens": list(ids)}


def detokenize(engine: LLMEngine, request: DetokenizeRequest) -> dict[str, Any]:
    """`/detokenize`'s body: the ids' text (ids outside the vocabulary are refused by name)."""
    tokenizer = _tokenizer(engine)
    ids = checked_token_ids(request.tokens, engine.model_config.vocab_size)
    return {"prompt": tokenizer.decode(ids)}
