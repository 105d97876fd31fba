"""`roseinfer serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over an `AsyncLLMEngine`.

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (JSON or `stream: true` server-sent events),
`GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text), `GET /version`, and vLLM's `POST /tokenize`
and `POST /detokenize`. Errors come back in OpenAI's
shape, `{"error": {"message", "type", "param", "code"}}`: 400 for a request the engine refuses, 404 for another
model's name, 500 once the engine is dead. A client that disconnects has its requests aborted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from functools import partial
from operator import methodcaller
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from roseinfer.engine.request_stream import EngineDeadError
from roseinfer.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIModel,
    SamplingFields,
)
from roseinfer.entrypoints.openai.responses import error_body
from roseinfer.entrypoints.openai.serving import ModelNotFoundError, OnlineEngine, OpenAIServing
from roseinfer.entrypoints.openai.tokenize import DetokenizeRequest, TokenizeRequest, detokenize, tokenize
from roseinfer.metrics import Counter

logger = logging.getLogger("roseinfer.serve")


def error_response(message: str, status: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status)


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (its body was read already, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """`work`'s response, or 499 (client closed request) once the client disconnects first: the work is
    cancelled, which aborts its requests."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait([task, gone], return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    return task.result() if task.done() and not task.cancelled() else Response(status_code=499)


def prometheus_text(metrics: list[Any]) -> str:
    lines = []
    for metric in metrics:
        name = metric.name.replace(":", "_") + ("_total" if isinstance(metric, Counter) else "")
        labels = ",".join(f'{key}="{value}"' for key, value in metric.labels.items())
        lines.append(f"{name}{{{labels}}} {metric.value}" if labels else f"{name} {metric.value}")
    return "\n".join(lines) + "\n"


def build_app(engine: OnlineEngine, model_name: str) -> FastAPI:
    """The server's routes over `engine` (which the caller closes), serving it as `model_name`."""
    from roseinfer import __version__

    app = FastAPI(title="roseinfer", version=__version__)
    app.state.engine = engine
    serving = OpenAIServing(engine, model_name)
    max_model_len = engine.max_model_len

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(map(str, e['loc'][1:])) or 'body'}: {e['msg']}" for e in exc.errors()]
        return error_response("; ".join(problems), 400)

    async def answer(request: Request, body: OpenAIModel, handler: Any) -> Response:
        if body.ignored_fields():
            logger.warning("ignored request fields: %s", ", ".join(body.ignored_fields()))
        try:
            result = await handler(body)
        except ModelNotFoundError as e:
            return error_response(str(e), 404, "model")
        except ValueError as e:
            return error_response(str(e), 400)
        except EngineDeadError as e:
            return error_response(str(e), 500)
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream")

    async def answer_or_abandon(request: Request, body: SamplingFields, handler: Any) -> Response:
        return await _unless_disconnected(request, answer(request, body, handler))

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Response:
        return await answer_or_abandon(request, body, serving.completions)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        return await answer_or_abandon(request, body, serving.chat)

    @app.post("/tokenize")
    async def tokenize_route(request: Request, body: TokenizeRequest) -> Response:
        return await answer(request, body, partial(serving.on_engine, tokenize))

    @app.post("/detokenize")
    async def detokenize_route(request: Request, body: DetokenizeRequest) -> Response:
        return await answer(request, body, partial(serving.on_engine, detokenize))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "roseinfer",
                "root": model_name, "max_model_len": max_model_len}  # fmt: skip
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Response:
        if engine.dead is not None:
            return error_response(f"the engine is dead: {engine.dead!r}", 500)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        try:
            text = prometheus_text(await engine.call(methodcaller("get_metrics")))
        except EngineDeadError as e:
            return error_response(str(e), 500)
        return PlainTextResponse(text)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    return app

