"""The server over real sockets (uvicorn in a thread): a client that hangs up has its request aborted, streamed
or not, and its blocks freed; requests in flight together each get their own answer; a dead engine says so in the
open stream, on `/health` and to every later request."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from functools import partial

import httpx
import pytest

from roseinfer import LLM
from roseinfer.engine.async_engine import AsyncLLMEngine
from roseinfer.engine.engine_process import EngineProcess
from roseinfer.entrypoints.openai.server_thread import ServerThread
from tests.serve import engine_state

LONG = {"prompt": [1, 2, 3], "max_tokens": 1000, "ignore_eos": True, "temperature": 0}


class Server(ServerThread):
    def __init__(self, mode: str) -> None:
        kwargs = {"load_format": "dummy", "device": "cpu", "block_size": 4, "num_kv_blocks": 512}
        online = EngineProcess("tiny-llama", **kwargs) if mode == "process" else AsyncLLMEngine(
            LLM("tiny-llama", **kwargs).engine
        )
        super().__init__(online, "m")

    def state(self) -> dict[str, float]:
        return asyncio.run(self.engine.call(engine_state.load))

    def wait_idle(self, timeout: float = 10.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while (state := self.state())["busy"] or state["usage"]:
            assert time.monotonic() < deadline, f"the engine still holds requests: {state}"
            time.sleep(0.02)
        return state


@pytest.fixture(params=["process", "thread"])
def server(request) -> Iterator[Server]:
    running = Server(request.param)
    yield running
    running.close()


def test_a_stream_the_client_drops_is_aborted(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as response:
            lines = response.iter_lines()
            got = [next(lines) for _ in range(3)]
        assert got[0].startswith("data: ")
    state = server.wait_idle()
    assert (state["aborted"], state["length"]) == (1, 0)


def test_a_plain_request_whose_client_hangs_up_is_aborted(server: Server) -> None:
    body = json.dumps(LONG).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        conn.sendall(head.encode() + body)
        deadline = time.monotonic() + 10
        while not server.state()["busy"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    state = server.wait_idle()
    assert (state["aborted"], state["length"]) == (1, 0)


def test_requests_in_flight_together_each_get_their_answer(server: Server) -> None:
    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            good = [{"prompt": [1, 2, k], "max_tokens": 5 + k, "ignore_eos": True} for k in range(6)]
            bad = [{"prompt": [1, 2], "temperature": -3}, {"prompt": [1, 10**8]}]
            return await asyncio.gather(*(client.post("/v1/completions", json=b) for b in good + bad))

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200] * 6 + [400, 400]
    assert [r.json()["usage"]["completion_tokens"] for r in responses[:6]] == [5 + k for k in range(6)]
    assert server.wait_idle()["aborted"] == 0


def says_it_is_dead(server: Server, said: str, kill: bool = False) -> None:
    """A stream in flight ends with an error event naming `said`, then [DONE]; `/health` and later requests
    answer 500. `kill`: the engine's process is killed once the stream has begun."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            if kill:
                os.kill(server.engine.pid, signal.SIGKILL)
            lines = [line for line in lines if line]
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][len("data: ") :])["error"]
        assert said in error["message"] and error["code"] == 500
        health = client.get("/health")
        assert health.status_code == 500 and said in health.json()["error"]["message"]
        later = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 2})
        assert later.status_code == 500 and "dead" in later.json()["error"]["message"]


@pytest.mark.no_invariant_hook
def test_a_failed_step_says_so_everywhere(server: Server) -> None:
    asyncio.run(server.engine.call(partial(engine_state.fail_step, after=4, message="device fault")))
    says_it_is_dead(server, "device fault")


def test_an_engine_process_that_dies_says_so_everywhere() -> None:
    server = Server("process")
    try:
        says_it_is_dead(server, "the engine process exited (code -9)", kill=True)
    finally:
        server.close()
