"""One online request's outputs as an async stream: what `AsyncLLMEngine` (engine on a thread) and `EngineProcess`
(engine in a process) both hand their callers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from roseinfer.outputs import RequestOutput
from roseinfer.sampling_params import SamplingParams

if TYPE_CHECKING:
    from roseinfer.engine.llm_engine import Prompt

END = None  # what a stream's queue gets when its request ends without a finished output (aborted, closed)


class EngineDeadError(RuntimeError):
    """The engine can take no more requests: a step failed (the cause is chained), it exited, or it was closed."""


class StreamOwner(Protocol):
    def _abort_stream(self, stream: RequestStream) -> None: ...


@dataclass(eq=False)
class RequestStream:
    """One request's outputs, in order, as the engine hands them over. Iterate it once (`async for`, or
    `batches()`); leaving the loop before the finished output aborts the request."""

    request_id: str
    _engine: StreamOwner
    _loop: asyncio.AbstractEventLoop
    _queue: asyncio.Queue[RequestOutput | BaseException | None] = field(default_factory=asyncio.Queue)
    done: bool = False  # the finished output (or the request's end) was read

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._outputs()

    async def _outputs(self) -> AsyncIterator[RequestOutput]:
        async for batch in self.batches():
            for out in batch:
                yield out

    async def batches(self) -> AsyncIterator[list[RequestOutput]]:
        """The outputs in batches: each time, every output that has come and not been read (a reader that falls
        behind catches up in one turn, e.g. one write to a socket)."""
        try:
            while not self.done:
                batch = [await self._queue.get()]
                while not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                outs = []
                for item in batch:
                    if item is END or isinstance(item, BaseException):
                        self.done = True
                        if outs:
                            yield outs
                        if item is not END:
                            raise item
                        return
                    outs.append(item)
                    if item.finished:
                        self.done = True
                        break
                yield outs
        finally:
            if not self.done:  # the reader left early (cancelled, closed, raised): nobody wants the rest
                self.abort()

    def abort(self) -> None:
        if not self.done:
            self.done = True
            self._engine._abort_stream(self)


class OnlineEngineBase:
    """What both online engines share: request ids, a new request's stream, and `generate` over `add_request`."""

    def __init__(self) -> None:
        self._ids = itertools.count()

    def _new_stream(self, request_id: str | None) -> RequestStream:
        rid = request_id if request_id is not None else f"async-{next(self._ids)}"
        return RequestStream(rid, self, asyncio.get_running_loop())  # type: ignore[arg-type]

    async def add_request(
        self, prompt: Prompt, params: SamplingParams, request_id: str | None = None
    ) -> RequestStream:
        raise NotImplementedError

    async def generate(
        self, prompt: Prompt, params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """`add_request`, then the request's outputs as they come."""
        stream = await self.add_request(prompt, params, request_id)
        async for out in stream:
            yield out


def put_all(items: list[tuple[RequestStream, Any]]) -> None:
    """On the streams' loop: each item into its stream's queue."""
    for stream, item in items:
        stream._queue.put_nowait(item)


def post(loop: asyncio.AbstractEventLoop, items: list[tuple[RequestStream, Any]]) -> bool:
    """Hands `items` to `loop` (from any thread); False where the loop is closed (nobody will read them)."""
    try:
        loop.call_soon_threadsafe(put_all, items)
    except RuntimeError:
        return False
    return True


def by_loop(items: list[tuple[RequestStream, Any]]) -> dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, Any]]]:
    grouped: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, Any]]] = {}
    for stream, item in items:
        grouped.setdefault(stream._loop, []).append((stream, item))
    return grouped
