"""The OpenAI API's response bodies, built as plain dicts from engine outputs: choices, logprobs, usage, errors."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from roseinfer.logprobs import Logprob
from roseinfer.outputs import CompletionOutput, RequestOutput

ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "Error"), "param": param, "code": status}}


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event: `data: <json>` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


def token_text(token_id: int, logprob: Logprob) -> str:
    """A token's text as the logprobs show it; `token_id:N` where the engine has no tokenizer (vLLM's form)."""
    return logprob.decoded_token if logprob.decoded_token is not None else f"token_id:{token_id}"


def _top(position: dict[int, Logprob], k: int) -> list[tuple[int, Logprob]]:
    """The position's k most likely tokens, by rank (the sampled token is among them only if it ranks there)."""
    ranked = sorted(position.items(), key=lambda item: item[1].rank or 0)
    return [(tid, lp) for tid, lp in ranked if lp.rank is not None and lp.rank <= k][:k]


def chat_logprobs(token_ids: list[int], logprobs: list[dict[int, Logprob]], k: int) -> dict[str, Any]:
    """`choices[i].logprobs` of a chat completion: each token with its logprob, bytes and top `k`."""

    def entry(tid: int, lp: Logprob) -> dict[str, Any]:
        text = token_text(tid, lp)
        return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode())}

    content = []
    for tid, position in zip(token_ids, logprobs):
        item = entry(tid, position[tid])
        item["top_logprobs"] = [entry(t, lp) for t, lp in _top(position, k)]
        content.append(item)
    return {"content": content}


@dataclass
class CompletionLogprobs:
    """`choices[i].logprobs` of a (legacy) completion, grown one output at a time: text offsets run over the
    sample's whole text, so a streamed sample keeps one of these."""

    offset: int = 0
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[str, float]] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def add(self, token_ids: list[int], logprobs: list[dict[int, Logprob]]) -> dict[str, Any]:
        """Appends these tokens; returns the body of just them (a streamed chunk's)."""
        start = len(self.tokens)
        for tid, position in zip(token_ids, logprobs):
            text = token_text(tid, position[tid])
            self.tokens.append(text)
            self.token_logprobs.append(position[tid].logprob)
            self.top_logprobs.append({token_text(t, lp): lp.logprob for t, lp in position.items()})
            self.text_offset.append(self.offset)
            self.offset += len(text)
        return self.body(start)

    def body(self, start: int = 0) -> dict[str, Any]:
        return {
            "tokens": self.tokens[start:],
            "token_logprobs": self.token_logprobs[start:],
            "top_logprobs": self.top_logprobs[start:],
            "text_offset": self.text_offset[start:],
        }


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


@dataclass
class ResponseHead:
    """What every body or chunk of one response repeats."""

    id: str
    model: str
    object: str
    created: int = field(default_factory=lambda: int(time.time()))

    def body(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": choices, **extra}  # fmt: skip

    def chunk_prefix(self) -> str:
        """A streamed chunk's event up to its one choice: the chunk is this, the choice's JSON, then `]}` and a
        blank line (the head serialised once a response, not once a token)."""
        return "data: " + json.dumps(self.body([]))[:-2]


def finish_fields(sample: CompletionOutput) -> dict[str, Any]:
    return {"finish_reason": sample.finish_reason, "stop_reason": sample.stop_reason}


def token_id_fields(out: RequestOutput, sample: CompletionOutput, first: bool) -> dict[str, Any]:
    """vLLM's `return_token_ids`: the sample's ids, and the prompt's on a choice's first body or chunk."""
    fields: dict[str, Any] = {"token_ids": list(sample.token_ids)}
    if first:
        fields["prompt_token_ids"] = list(out.prompt_token_ids)
    return fields
