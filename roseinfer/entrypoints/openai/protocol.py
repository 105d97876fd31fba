"""The OpenAI API's request bodies (`/v1/completions`, `/v1/chat/completions`) with vLLM's extra sampling fields,
and their translation into `SamplingParams`.

Fields the server does not know are ignored (and logged), as vLLM's server does: OpenAI's clients send some
(`user`, `store`, `metadata`). Fields it knows but cannot honour (`echo`, `suffix`, `best_of` above `n`, tools, a
JSON response format, a non-text content part) are refused by name. Numbers are checked by `SamplingParams`,
whose messages name the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from roseinfer.sampling_params import RequestOutputKind, SamplingParams

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for a bias, which vLLM's server clamps to


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow")

    def ignored_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


class StreamOptions(OpenAIModel):
    include_usage: StrictBool = False


class SamplingFields(OpenAIModel):
    """What both endpoints take: OpenAI's sampling fields, then vLLM's extras."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: StrictInt | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extras
    top_k: StrictInt | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = 0
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    allowed_token_ids: list[StrictInt] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: StrictInt | None = None
    cache_salt: str | None = None
    return_token_ids: StrictBool = False  # each choice carries its token ids (and the prompt's), as vLLM's

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(
        self, max_tokens: int | None, logprobs: int | None, output_kind: RequestOutputKind
    ) -> SamplingParams:
        """The request's `SamplingParams`; a bad value raises ValueError naming its field."""
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        bias = None
        if self.logit_bias is not None:
            bias = {
                key: min(max(value, -LOGIT_BIAS_LIMIT), LOGIT_BIAS_LIMIT)
                for key, value in self.logit_bias.items()
            }
        optional = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
        }
        return SamplingParams(
            **{name: value for name, value in optional.items() if value is not None},
            n=self.n,
            max_tokens=max_tokens,
            stop=self.stop,
            stop_token_ids=list(self.stop_token_ids or []),
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=bias,  # type: ignore[arg-type]  # string keys: SamplingParams reads the ids in them
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            allowed_token_ids=self.allowed_token_ids,
            bad_words=self.bad_words,
            truncate_prompt_tokens=self.truncate_prompt_tokens,
            logprobs=logprobs,
            output_kind=output_kind,
        )


Prompts = str | list[StrictInt] | list[str] | list[list[StrictInt]]


class CompletionRequest(SamplingFields):
    prompt: Prompts
    max_tokens: StrictInt | None = 16
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = None

    def refuse_unsupported(self) -> None:
        if self.echo:
            raise ValueError("echo is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of ({self.best_of}) other than n ({self.n}) is not supported")

    def prompt_list(self) -> list[str | list[int]]:
        """The prompt as a list of prompts: a string or a list of ids is one."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]  # type: ignore[list-item]
        if not prompt:
            raise ValueError("prompt must not be empty")
        return list(prompt)  # type: ignore[arg-type]


class ContentPart(OpenAIModel):
    type: str
    text: str | None = None


class ChatMessage(OpenAIModel):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def template_dict(self) -> dict[str, Any]:
        """The message as a chat template reads it: text content as one string (parts joined by newlines)."""
        content = self.content
        if isinstance(content, list):
            kinds = sorted({part.type for part in content} - {"text"})
            if kinds:
                raise ValueError(f"content parts of type {kinds} are not supported (text only)")
            content = "\n".join(part.text or "" for part in content)
        message: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: StrictBool = True

    def refuse_unsupported(self) -> None:
        if self.tools:
            raise ValueError("tools are not supported")
        if self.tool_choice not in (None, "none"):
            raise ValueError("tool_choice is not supported")
        kind = (self.response_format or {}).get("type", "text")
        if kind != "text":
            raise ValueError(f"response_format {kind!r} is not supported (text only)")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")

    def max_new_tokens(self) -> int | None:
        """`max_completion_tokens`, else the deprecated `max_tokens`; None runs to the context's end."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
