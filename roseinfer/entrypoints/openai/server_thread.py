"""The OpenAI server on a thread of this process and a free local port, over an online engine (`AsyncLLMEngine` or
`EngineProcess`): what `bench serve --http` and the tests run a client against (`roseinfer serve` runs uvicorn
in the foreground)."""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from roseinfer.entrypoints.openai.serving import OnlineEngine


class ServerThread:
    """Serves `engine` as `name` at `self.url` until `close()` (or the `with` block's end), which stops the
    server, then closes the engine (an `AsyncLLMEngine`'s `LLMEngine` stays usable)."""

    def __init__(self, engine: OnlineEngine, name: str, start_timeout: float = 30.0) -> None:
        import uvicorn

        from roseinfer.entrypoints.openai.api_server import build_app

        self.engine = engine
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(build_app(self.engine, name), log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="roseinfer-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + start_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the HTTP server did not start on {self.url}")
            time.sleep(0.01)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self._sock.close()
        self.engine.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
