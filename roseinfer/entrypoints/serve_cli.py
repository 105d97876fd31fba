"""`roseinfer serve`: start the engine in a process of its own, serve the OpenAI API until interrupted.

    roseinfer serve                                   # the built-in tiny-llama, dummy weights, port 8000
    roseinfer serve --model path/to/hf-dir --port 8000 --served-model-name my-model

The HTTP side (fastapi, uvicorn) is the `[serve]` extra: `pip install -e ".[serve]"`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from roseinfer.entrypoints.arg_types import positive_int

if TYPE_CHECKING:
    from roseinfer.entrypoints.openai.serving import OnlineEngine


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    from roseinfer.entrypoints.cli import add_engine_arguments, add_model_arguments

    add_model_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--served-model-name", default=None, help="the name clients ask for (default: --model as given)"
    )
    parser.add_argument("--max-num-seqs", type=positive_int, default=256, help="requests in a batch at most")
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    parser.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")
    parser.add_argument(
        "--engine-thread",
        action="store_true",
        help="step the engine on a thread of the server's process, not in a process of its own",
    )
    add_engine_arguments(parser)


def _need_http_packages() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ValueError(
            f"roseinfer serve needs fastapi and uvicorn ({e.name} is missing): pip install -e \".[serve]\""
        ) from e


def run_serve(args: argparse.Namespace) -> int:
    _need_http_packages()
    import uvicorn

    from roseinfer.entrypoints.cli import llm_kwargs
    from roseinfer.entrypoints.openai.api_server import build_app

    model, kwargs = llm_kwargs(args, max_num_seqs=args.max_num_seqs)
    engine: OnlineEngine
    if args.engine_thread:
        from roseinfer.engine.async_engine import AsyncLLMEngine
        from roseinfer.entrypoints.llm import LLM

        engine = AsyncLLMEngine(LLM(model, **kwargs).engine)  # type: ignore[arg-type]
        startup = engine.engine.core.startup.line()
    else:
        from roseinfer.engine.engine_process import EngineProcess

        engine = EngineProcess(model, **kwargs)
        startup = engine.startup
    name = args.served_model_name or model
    print(f"# serving {name!r} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    print(f"# {startup}", file=sys.stderr)
    try:
        app = build_app(engine, name)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=args.access_log)
    finally:
        engine.close()
    return 0
