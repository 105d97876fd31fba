"""The online engine in a process of its own: `EngineProcess` takes the calls `AsyncLLMEngine` takes, but the
`LLM` it builds runs in a child process, so the engine's host work (schedule, inputs, sampling, detokenizing)
does not share an interpreter lock with the server's (HTTP, JSON). vLLM's engine core runs the same way.

One pipe each way carries pickled messages. To the engine: add, abort, call (a picklable function of the
`LLMEngine`), close. From it: ready (or failed), each add's answer, each call's result, each step's outputs (one
message a step, compact: a request's prompt ids go once, with its first output), dead. A reader thread routes
them to the callers' streams and futures; an engine process that exits ends every stream with EngineDeadError.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import multiprocessing
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from roseinfer.engine.llm_engine import Prompt
from roseinfer.engine.request_stream import (
    END,
    EngineDeadError,
    OnlineEngineBase,
    RequestStream,
    by_loop,
    post,
)
from roseinfer.outputs import CompletionOutput, RequestOutput
from roseinfer.sampling_params import SamplingParams

T = TypeVar("T")
Packed = tuple[Any, ...]


def pack_output(out: RequestOutput, first: bool) -> Packed:
    """An output as plain tuples; the prompt (its ids, text and logprobs) only on a request's first."""
    samples = [
        (s.index, s.text, s.token_ids, s.finish_reason, s.stop_reason, s.logprobs, s.cumulative_logprob)
        for s in out.outputs
    ]
    prompt = (out.prompt, out.prompt_token_ids, out.prompt_logprobs) if first else None
    return out.request_id, out.finished, out.num_cached_tokens, samples, prompt


def unpack_output(packed: Packed, prompts: dict[str, tuple[Any, ...]]) -> RequestOutput:
    rid, finished, cached, samples, prompt = packed
    if prompt is not None:
        prompts[rid] = prompt
    text, ids, logprobs = prompts[rid]
    if finished:
        del prompts[rid]
    outputs = [CompletionOutput(*sample) for sample in samples]
    return RequestOutput(rid, text, ids, outputs, finished, cached, prompt_logprobs=logprobs)


def _portable(e: BaseException) -> BaseException:
    """An engine-side exception as one that pickles whatever it held: a ValueError stays one (bad input)."""
    return ValueError(str(e)) if isinstance(e, ValueError) else EngineDeadError(f"{type(e).__name__}: {e}")


def engine_main(conn: Connection, model: str, kwargs: dict[str, Any]) -> None:
    """The child's loop: build the engine, then apply what arrives and step while there is work."""
    from roseinfer.entrypoints.llm import LLM

    try:
        engine = LLM(model, **kwargs).engine
    except BaseException as e:
        conn.send(("failed", _portable(e)))
        return
    conn.send(("ready", {"max_model_len": engine.config.max_model_len, "startup": engine.core.startup.line()}))
    live: set[str] = set()  # added, not yet finished or aborted
    started: set[str] = set()  # those whose first output went out
    dead: BaseException | None = None
    while True:
        if dead is not None or not engine.has_unfinished_requests():
            conn.poll(None)
        while conn.poll():
            message = conn.recv()
            kind = message[0]
            if kind == "close":
                return
            if kind == "add":
                _, token, rid, prompt, params = message
                try:
                    if dead is not None:
                        raise EngineDeadError(f"the engine is dead: a step failed with {dead!r}")
                    engine.add_request(prompt, params, request_id=rid)
                except BaseException as e:
                    conn.send(("answer", token, _portable(e)))
                    continue
                live.add(rid)
                conn.send(("answer", token, None))
            elif kind == "abort":
                if message[1] in live:
                    live.discard(message[1])
                    started.discard(message[1])
                    engine.abort_request(message[1])
            elif kind == "call":
                _, token, fn = message
                try:
                    conn.send(("result", token, fn(engine), None))
                except BaseException as e:
                    conn.send(("result", token, None, _portable(e)))
        if dead is None and engine.has_unfinished_requests():
            try:
                outputs = engine.step()
            except BaseException as e:
                dead = e
                live.clear()
                started.clear()
                conn.send(("dead", f"an engine step failed: {e!r}"))
                continue
            packed = []
            for out in outputs:
                rid = out.request_id
                if rid in live:
                    packed.append(pack_output(out, rid not in started))
                    started.add(rid)
                    if out.finished:
                        live.discard(rid)
                        started.discard(rid)
            if packed:
                conn.send(("outputs", packed))


class EngineProcess(OnlineEngineBase):
    """`LLM(model, **kwargs)` in a spawned process, driven as `AsyncLLMEngine` is (add_request, generate, call,
    abort, close). Starting blocks until the engine is built; a model that fails to build raises here."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__()
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: CUDA cannot survive a fork
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=engine_main, args=(child, model, kwargs), name="roseinfer-engine", daemon=True
        )
        self._process.start()
        child.close()
        try:
            kind, info = self._conn.recv()
        except EOFError:
            self._process.join(5)
            raise EngineDeadError(f"the engine process exited with {self._process.exitcode} while starting") from None
        if kind == "failed":
            self._process.join(30)
            raise info
        self.pid: int = self._process.pid  # type: ignore[assignment]
        self.max_model_len: int = info["max_model_len"]
        self.startup: str = info["startup"]
        self.dead: BaseException | None = None
        self._closing = False
        self._lock = threading.Lock()  # the streams, the waiting futures and the pipe's sending end
        self._streams: dict[str, RequestStream] = {}
        self._waiting: dict[int, concurrent.futures.Future[Any]] = {}
        self._tokens = itertools.count()
        self._reader = threading.Thread(target=self._read, name="roseinfer-engine-reader", daemon=True)
        self._reader.start()

    # -- the callers' side ----------------------------------------------------------------------------

    async def add_request(
        self, prompt: Prompt, params: SamplingParams, request_id: str | None = None
    ) -> RequestStream:
        stream = self._new_stream(request_id)
        rid = stream.request_id
        with self._lock:
            if rid in self._streams:
                raise ValueError(f"request_id {rid!r} is already in use")
            self._streams[rid] = stream  # before the add goes: its outputs may come at once
        try:
            await self._ask("add", rid, prompt, params)
        except asyncio.CancelledError:
            stream.abort()  # it may be added by now
            raise
        except BaseException:
            stream.done = True  # refused: nothing to abort
            with self._lock:
                if self._streams.get(rid) is stream:
                    del self._streams[rid]
            raise
        return stream

    async def call(self, fn: Callable[[Any], T]) -> T:
        """`fn(engine)` run in the engine's process between steps; `fn` must pickle (a module's function, a
        `functools.partial` or `operator.methodcaller` of one)."""
        return await self._ask("call", fn)

    def abort(self, request_id: str) -> None:
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is not None:
            self._abort_stream(stream)

    def close(self, timeout: float | None = 30.0) -> None:
        """Stops the engine process and ends every open request (EngineDeadError)."""
        with self._lock:
            self._closing = True
            self._send_locked(("close",))
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._reader.join(5)
        self._fail_all(EngineDeadError("the engine was closed"))

    def _abort_stream(self, stream: RequestStream) -> None:
        with self._lock:
            if self._streams.get(stream.request_id) is not stream:
                return
            del self._streams[stream.request_id]
            self._send_locked(("abort", stream.request_id))
        post(stream._loop, [(stream, END)])

    async def _ask(self, kind: str, *payload: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self.dead is not None:
                raise EngineDeadError(f"the engine is dead: {self.dead}") from self.dead
            token = next(self._tokens)
            self._waiting[token] = future
            self._send_locked((kind, token, *payload))
        return await asyncio.wrap_future(future)

    def _send_locked(self, message: tuple[Any, ...]) -> None:
        try:
            self._conn.send(message)
        except (OSError, ValueError):  # the engine process is gone: the reader fails everything
            pass

    # -- the reader thread ----------------------------------------------------------------------------

    def _read(self) -> None:
        prompts: dict[str, tuple[Any, ...]] = {}
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                self._process.join(5)
                what = "was closed" if self._closing else f"process exited (code {self._process.exitcode})"
                self._fail_all(EngineDeadError(f"the engine {what}"))
                return
            kind = message[0]
            if kind == "outputs":
                self._deliver([unpack_output(packed, prompts) for packed in message[1]])
            elif kind in ("answer", "result"):
                token, *rest = message[1:]
                with self._lock:
                    future = self._waiting.pop(token)
                error = rest[-1]
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(rest[0] if kind == "result" else None)
            elif kind == "dead":
                self._fail_all(EngineDeadError(message[1]))

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        items = []
        with self._lock:
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is None:
                    continue  # aborted since
                items.append((stream, out))
                if out.finished:
                    del self._streams[out.request_id]
        for loop, share in by_loop(items).items():
            if not post(loop, share):
                for stream, _ in share:
                    self._abort_stream(stream)

    def _fail_all(self, error: EngineDeadError) -> None:
        with self._lock:
            if self.dead is None:
                self.dead = error
            streams, self._streams = list(self._streams.values()), {}
            waiting, self._waiting = list(self._waiting.values()), {}
        for future in waiting:
            if not future.done():
                future.set_exception(error)
        for loop, share in by_loop([(stream, error) for stream in streams]).items():
            post(loop, share)
