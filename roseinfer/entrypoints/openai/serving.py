"""`/v1/completions` and `/v1/chat/completions` on an `AsyncLLMEngine`: a request's prompts are validated and
queued before anything is sent (a bad one fails the whole request with its message, and queues none), then
answered as one JSON body or as server-sent events (DELTA outputs, as they come)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

from roseinfer.engine.async_engine import AsyncLLMEngine
from roseinfer.engine.engine_process import EngineProcess
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.engine.request_stream import RequestStream
from roseinfer.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from roseinfer.entrypoints.openai.responses import (
    CompletionLogprobs,
    ResponseHead,
    chat_logprobs,
    error_body,
    finish_fields,
    sse,
    token_id_fields,
    usage,
)
from roseinfer.outputs import CompletionOutput, RequestOutput
from roseinfer.sampling_params import RequestOutputKind, SamplingParams


class ModelNotFoundError(LookupError):
    pass


def render_chat(engine: LLMEngine, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    """The conversation as prompt ids, through the tokenizer's chat template (run on the engine thread)."""
    from jinja2 import TemplateError

    from roseinfer.tokenizer import apply_chat_template

    if engine.tokenizer is None:
        raise ValueError("chat completions need a tokenizer with a chat template; this model has none")
    try:
        return apply_chat_template(engine.tokenizer, messages, add_generation_prompt)
    except TemplateError as e:
        raise ValueError(f"the chat template refused the messages: {e}") from e


async def merge(streams: Sequence[RequestStream]) -> AsyncIterator[list[tuple[int, RequestOutput]]]:
    """Outputs of several streams in batches as they come (`RequestStream.batches`), each with its stream's
    index. Leaving early aborts them all. One stream (a request's usual count) is read directly."""
    if len(streams) == 1:
        async for batch in streams[0].batches():
            yield [(0, out) for out in batch]
        return
    queue: asyncio.Queue[tuple[int, list[RequestOutput] | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for batch in stream.batches():
                queue.put_nowait((i, batch))
            queue.put_nowait((i, None))
        except Exception as e:
            queue.put_nowait((i, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            got = [await queue.get()]
            while not queue.empty():
                got.append(queue.get_nowait())
            ready = []
            for i, item in got:
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    ready += [(i, out) for out in item]
            if ready:
                yield ready
    finally:
        for task, stream in zip(tasks, streams):
            task.cancel()
            stream.abort()  # a task cancelled before it began iterating would not abort its stream


OnlineEngine = AsyncLLMEngine | EngineProcess  # the engine on a thread of the server's process, or in its own


class OpenAIServing:
    def __init__(self, engine: OnlineEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def check_model(self, request: Any) -> None:
        if request.model is not None and request.model != self.model_name:
            raise ModelNotFoundError(f"The model `{request.model}` does not exist.")

    async def completions(self, request: CompletionRequest) -> dict[str, Any] | AsyncIterator[str]:
        self.check_model(request)
        request.refuse_unsupported()
        prompts = request.prompt_list()
        params = request.sampling_params(request.max_tokens, request.logprobs, _kind(request))
        head = ResponseHead(f"cmpl-{uuid.uuid4().hex}", self.model_name, "text_completion")
        streams = await self._add_all(prompts, params, head.id, request.cache_salt)
        if request.stream:
            return self._stream(request, head, streams, _CompletionChoices(request))
        outs = await _finals(streams)
        choices = _CompletionChoices(request)
        body = [choices.choice(i, out, s) for i, out in enumerate(outs) for s in out.outputs]
        return head.body(body, usage=_usage(outs, _generated(outs)))

    async def chat(self, request: ChatCompletionRequest) -> dict[str, Any] | AsyncIterator[str]:
        self.check_model(request)
        request.refuse_unsupported()
        messages = [m.template_dict() for m in request.messages]
        add_prompt = request.add_generation_prompt
        ids = await self.engine.call(partial(render_chat, messages=messages, add_generation_prompt=add_prompt))
        params = request.sampling_params(request.max_new_tokens(), request.num_logprobs(), _kind(request))
        head = ResponseHead(f"chatcmpl-{uuid.uuid4().hex}", self.model_name, "chat.completion")
        streams = await self._add_all([ids], params, head.id, request.cache_salt)
        if request.stream:
            head.object = "chat.completion.chunk"
            return self._stream(request, head, streams, _ChatChoices(request))
        outs = await _finals(streams)
        choices = _ChatChoices(request)
        return head.body([choices.choice(0, outs[0], s) for s in outs[0].outputs], usage=_usage(outs, _generated(outs)))

    async def on_engine(self, fn: Any, request: Any) -> dict[str, Any]:
        """`fn(engine, request)` where the engine runs (the tokenizer routes)."""
        self.check_model(request)
        if hasattr(request, "refuse_unsupported"):
            request.refuse_unsupported()
        return await self.engine.call(partial(fn, request=request))

    async def _add_all(
        self, prompts: list[str | list[int]], params: SamplingParams, base_id: str, salt: str | None
    ) -> list[RequestStream]:
        streams: list[RequestStream] = []
        try:
            for i, prompt in enumerate(prompts):
                key = "prompt" if isinstance(prompt, str) else "prompt_token_ids"
                entry = {key: prompt} if salt is None else {key: prompt, "cache_salt": salt}
                try:
                    streams.append(await self.engine.add_request(entry, params, f"{base_id}-{i}"))
                except ValueError as e:
                    raise ValueError(f"prompt {i}: {e}" if len(prompts) > 1 else str(e)) from e
        except BaseException:
            for stream in streams:
                stream.abort()
            raise
        return streams

    async def _stream(
        self, request: SamplingFields, head: ResponseHead, streams: list[RequestStream], choices: _Choices
    ) -> AsyncIterator[str]:
        prompt_tokens: dict[int, RequestOutput] = {}
        generated = 0
        prefix = head.chunk_prefix()
        try:
            async for batch in merge(streams):
                events = []
                for i, out in batch:
                    prompt_tokens.setdefault(i, out)
                    for sample in out.outputs:
                        generated += len(sample.token_ids)
                        events += [prefix + json.dumps(chunk) + "]}\n\n" for chunk in choices.chunks(i, out, sample)]
                if events:
                    yield "".join(events)
            if request.include_usage():
                yield sse(head.body([], usage=_usage(list(prompt_tokens.values()), generated)))
        except Exception as e:  # the engine died or was closed mid-stream: say so in the stream
            yield sse(error_body(str(e), 500))
        yield sse("[DONE]")


class _Choices:
    """How one endpoint turns a sample's output into a choice (whole) or chunks (streamed)."""

    def __init__(self, request: SamplingFields) -> None:
        self.n = request.n
        self.token_ids = request.return_token_ids
        self.started: set[int] = set()

    def index(self, i: int, sample: CompletionOutput) -> int:
        return i * self.n + sample.index

    def choice(self, i: int, out: RequestOutput, sample: CompletionOutput) -> dict[str, Any]:
        raise NotImplementedError

    def chunks(self, i: int, out: RequestOutput, sample: CompletionOutput) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _ids(self, index: int, out: RequestOutput, sample: CompletionOutput) -> dict[str, Any]:
        first = index not in self.started
        self.started.add(index)
        return token_id_fields(out, sample, first) if self.token_ids else {}


class _CompletionChoices(_Choices):
    def __init__(self, request: CompletionRequest) -> None:
        super().__init__(request)
        self.logprobs = request.logprobs is not None
        self.sample_logprobs: dict[int, CompletionLogprobs] = {}

    def choice(self, i: int, out: RequestOutput, sample: CompletionOutput) -> dict[str, Any]:
        index = self.index(i, sample)
        logprobs = None
        if self.logprobs and sample.logprobs is not None:
            logprobs = self.sample_logprobs.setdefault(index, CompletionLogprobs()).add(
                sample.token_ids, sample.logprobs
            )
        fields = self._ids(index, out, sample)
        return {"index": index, "text": sample.text, "logprobs": logprobs, **finish_fields(sample), **fields}

    def chunks(self, i: int, out: RequestOutput, sample: CompletionOutput) -> list[dict[str, Any]]:
        if not (sample.text or sample.token_ids or sample.finish_reason):
            return []
        return [self.choice(i, out, sample)]


class _ChatChoices(_Choices):
    def __init__(self, request: ChatCompletionRequest) -> None:
        super().__init__(request)
        self.top_logprobs = request.num_logprobs()

    def _logprobs(self, sample: CompletionOutput) -> dict[str, Any] | None:
        if self.top_logprobs is None or sample.logprobs is None:
            return None
        return chat_logprobs(sample.token_ids, sample.logprobs, self.top_logprobs)

    def choice(self, i: int, out: RequestOutput, sample: CompletionOutput) -> dict[str, Any]:
        message = {"role": "assistant", "content": sample.text}
        fields = self._ids(sample.index, out, sample)
        return {"index": sample.index, "message": message, "logprobs": self._logprobs(sample),
                **finish_fields(sample), **fields}  # fmt: skip

    def chunks(self, i: int, out: RequestOutput, sample: CompletionOutput) -> list[dict[str, Any]]:
        chunks = []
        if sample.index not in self.started:  # a choice opens with the role, as OpenAI's streams do
            role = {"role": "assistant", "content": ""}
            chunks.append({"index": sample.index, "delta": role, "logprobs": None, "finish_reason": None})
        fields = self._ids(sample.index, out, sample)
        if sample.text or sample.token_ids or sample.finish_reason:
            delta = {"content": sample.text} if sample.text else {}
            chunks.append({"index": sample.index, "delta": delta, "logprobs": self._logprobs(sample),
                           **finish_fields(sample), **fields})  # fmt: skip
        return chunks


def _kind(request: SamplingFields) -> RequestOutputKind:
    return RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY


async def _finals(streams: list[RequestStream]) -> list[RequestOutput]:
    """Each stream's finished output (FINAL_ONLY: its one output), in stream order."""
    outs: list[RequestOutput | None] = [None] * len(streams)
    async for batch in merge(streams):
        for i, out in batch:
            outs[i] = out
    if any(out is None for out in outs):
        raise RuntimeError("a request ended without its output (aborted)")
    return outs  # type: ignore[return-value]


def _generated(outs: list[RequestOutput]) -> int:
    return sum(len(sample.token_ids) for out in outs for sample in out.outputs)


def _usage(outs: list[RequestOutput], generated: int) -> dict[str, Any]:
    prompt = sum(len(out.prompt_token_ids) for out in outs)
    return usage(prompt, generated, sum(out.num_cached_tokens for out in outs))
