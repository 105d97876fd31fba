"""The online engine: an `LLMEngine` stepped by a thread of its own, each request an async stream of outputs.

The engine thread owns the `LLMEngine`; nothing else touches it (nor its tokenizer, whose Rust side is not
to be shared between threads). Callers on any asyncio loop reach it through one queue of commands, applied
between steps: add a request, abort one, run a function on the engine (`call`). Each step's outputs go back in
one callback per caller loop. A request whose caller stops reading (a closed HTTP connection cancels the task)
is aborted, so its blocks return to the pool at the next step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from roseinfer.engine.llm_engine import LLMEngine, Prompt
from roseinfer.engine.request_stream import (
    END,
    EngineDeadError,
    OnlineEngineBase,
    RequestStream,
    by_loop,
    post,
)
from roseinfer.outputs import RequestOutput
from roseinfer.sampling_params import SamplingParams

T = TypeVar("T")
Command = tuple[Any, ...]


class AsyncLLMEngine(OnlineEngineBase):
    """`await add_request(prompt, params)` validates and queues a request (a bad one raises its ValueError there,
    before anything is streamed) and returns its `RequestStream`; `generate` does both and yields the outputs.
    `params.output_kind` says what each output holds, as in `LLMEngine.step`."""

    def __init__(self, engine: LLMEngine) -> None:
        super().__init__()
        self.engine = engine
        self.dead: BaseException | None = None
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._closing = False
        self._send_lock = threading.Lock()  # no command queued behind "close" goes unanswered
        self._streams: dict[str, RequestStream] = {}  # the engine thread's alone
        self._thread = threading.Thread(target=self._run, name="roseinfer-engine", daemon=True)
        self._thread.start()

    # -- the callers' side (any thread, any loop) ---------------------------------------------------

    async def add_request(
        self, prompt: Prompt, params: SamplingParams, request_id: str | None = None
    ) -> RequestStream:
        stream = self._new_stream(request_id)
        added: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._send_or_raise(("add", stream, prompt, params, added))
        try:
            await asyncio.wrap_future(added)
        except asyncio.CancelledError:
            stream.abort()  # it may have been added meanwhile
            raise
        except BaseException:
            stream.done = True
            raise
        return stream

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """`fn(engine)` run on the engine thread between steps (the tokenizer, metrics, anything stateful)."""
        result: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._send_or_raise(("call", fn, result))
        return await asyncio.wrap_future(result)

    @property
    def max_model_len(self) -> int:
        return self.engine.config.max_model_len

    def _abort_stream(self, stream: RequestStream) -> None:
        self._send(("abort", stream))

    def abort(self, request_id: str) -> None:
        """Abort a request by id (one this engine's `add_request` took); an unknown or finished id is ignored."""
        self._send(("abort_id", request_id))

    def close(self, timeout: float | None = 30.0) -> None:
        """Ends every open request (its stream raises EngineDeadError) and stops the engine thread."""
        with self._send_lock:
            if not self._closing:
                self._closing = True
                self._commands.put(("close",))
        self._thread.join(timeout)

    def _send(self, command: Command) -> bool:
        with self._send_lock:
            if self._closing:
                return False
            self._commands.put(command)
            return True

    def _send_or_raise(self, command: Command) -> None:
        if not self._send(command):
            raise EngineDeadError("the engine was closed")

    # -- the engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                if not self._run_once():
                    return
            except BaseException as e:  # a fault of this loop's own: fail open requests, refuse the rest
                if self.dead is None:
                    self.dead = e
                self._fail_all(EngineDeadError(f"the engine loop failed: {e!r}"))

    def _run_once(self) -> bool:
        """Apply the queued commands (waiting for one while idle), then step once; False once closed."""
        engine = self.engine
        idle = self.dead is not None or not engine.has_unfinished_requests()
        command: Command | None = self._commands.get() if idle else self._next_command()
        while command is not None:
            if command[0] == "close":
                self._fail_all(EngineDeadError("the engine was closed"))
                self._refuse_rest()
                return False
            self._apply(command)
            command = self._next_command()
        if self.dead is None and engine.has_unfinished_requests():
            try:
                outputs = engine.step()
            except BaseException as e:  # the engine is dead (LLMEngine.step): every open request fails
                self.dead = e
                error = EngineDeadError(f"an engine step failed: {e!r}")
                error.__cause__ = e
                self._fail_all(error)
                return True
            self._deliver(outputs)
        return True

    def _next_command(self) -> Command | None:
        try:
            return self._commands.get_nowait()
        except queue.Empty:
            return None

    def _apply(self, command: Command) -> None:
        kind = command[0]
        if kind == "add":
            _, stream, prompt, params, added = command
            if self._check_new(stream, added):
                try:
                    self.engine.add_request(prompt, params, request_id=stream.request_id)
                except BaseException as e:
                    added.set_exception(e)
                    return
                self._streams[stream.request_id] = stream
                added.set_result(None)
        elif kind == "abort":
            self._end(command[1])
        elif kind == "abort_id":
            stream = self._streams.get(command[1])
            if stream is not None:
                self._end(stream)
        elif kind == "call":
            _, fn, result = command
            try:
                result.set_result(fn(self.engine))
            except BaseException as e:
                result.set_exception(e)

    def _check_new(self, stream: RequestStream, added: concurrent.futures.Future[None]) -> bool:
        if not added.set_running_or_notify_cancel():
            return False
        if self.dead is not None:
            error = EngineDeadError(f"the engine is dead: a step failed with {self.dead!r}")
            added.set_exception(error)
            return False
        if stream.request_id in self._streams:
            added.set_exception(ValueError(f"request_id {stream.request_id!r} is already in use"))
            return False
        return True

    def _end(self, stream: RequestStream) -> None:
        """Abort `stream`'s request, if it is still this engine's (not one that took its id since)."""
        if self._streams.get(stream.request_id) is stream:
            del self._streams[stream.request_id]
            if self.dead is None:
                self.engine.abort_request(stream.request_id)
            self._post_all([(stream, END)])

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        items = []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted since the step began
            items.append((stream, out))
            if out.finished:
                del self._streams[out.request_id]
        self._post_all(items)

    def _post_all(self, items: list[tuple[RequestStream, Any]]) -> None:
        for loop, share in by_loop(items).items():
            if not post(loop, share):  # the caller's loop is closed: nobody will read these requests
                for stream, _ in share:
                    rid = stream.request_id
                    if self._streams.get(rid) is stream:
                        del self._streams[rid]
                        if self.dead is None:
                            self.engine.abort_request(rid)

    def _fail_all(self, error: BaseException) -> None:
        streams, self._streams = list(self._streams.values()), {}
        if self.dead is None:
            self.engine.abort_request([s.request_id for s in streams])
        self._post_all([(stream, error) for stream in streams])

    def _refuse_rest(self) -> None:
        """After close: whatever is still queued gets an answer, so no caller waits forever."""
        closed = EngineDeadError("the engine was closed")
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            future = command[4] if command[0] == "add" else command[2] if command[0] == "call" else None
            if future is not None and future.set_running_or_notify_cancel():
                future.set_exception(closed)

