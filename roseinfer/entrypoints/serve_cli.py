"""`roseinfer serve`: load the model, start the engine thread, serve the OpenAI API until interrupted.

    roseinfer serve                                   # the built-in tiny-llama, dummy weights, port 8000
    roseinfer serve --model path/to/hf-dir --port 8000 --served-model-name my-model

The HTTP side (fastapi, uvicorn) is the `[serve]` extra: `pip install -e ".[serve]"`.
"""

from __future__ import annotations

import argparse
import sys

from roseinfer.entrypoints.arg_types import positive_int


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

    from roseinfer.engine.async_engine import AsyncLLMEngine
    from roseinfer.entrypoints.cli import llm_from_args, model_and_format
    from roseinfer.entrypoints.openai.api_server import build_app

    model, _ = model_and_format(args)
    llm = llm_from_args(args, max_num_seqs=args.max_num_seqs)
    engine = AsyncLLMEngine(llm.engine)
    name = args.served_model_name or model
    print(f"# serving {name!r} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    print(f"# {llm.engine.core.startup.line()}", file=sys.stderr)
    try:
        uvicorn.run(build_app(engine, name), host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.close()
    return 0
