"""Functions the serving tests run on the engine through `call`: module-level, so that they pickle by name and
run in an engine process as on an engine thread."""

from __future__ import annotations

from typing import Any


def load(engine: Any) -> dict[str, float]:
    """Whether the engine holds any request, its KV usage, and its finished requests by reason."""
    finished = engine.core.scheduler.num_finished
    busy = engine.has_unfinished_requests() or bool(engine.groups)
    return {"busy": float(busy), "usage": engine.core.kv.usage(), "aborted": finished["abort"],
            "length": finished["length"]}  # fmt: skip


def fail_step(engine: Any, after: int, message: str) -> None:
    """From now, the engine's `after`-th core step raises RuntimeError(message)."""
    core, calls = engine.core, {"n": 0}
    real_step = core.step

    def failing_step() -> Any:
        calls["n"] += 1
        if calls["n"] == after:
            raise RuntimeError(message)
        return real_step()

    core.step = failing_step


def where(engine: Any) -> tuple[int, str]:
    """The process id and thread name a call runs on."""
    import os
    import threading

    return os.getpid(), threading.current_thread().name
