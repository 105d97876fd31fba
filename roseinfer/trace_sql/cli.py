"""The `trace-sql` command: arguments, reading the SQL, printing the result."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from roseinfer.trace_sql.engines import ENGINES, TP_BIN_ENV, query_trace
from roseinfer.trace_sql.errors import TraceQueryError
from roseinfer.trace_sql.examples import EXAMPLES, example_sql
from roseinfer.trace_sql.formats import FORMATS


def _examples_help() -> str:
    lines = ["canned queries (--example NAME):"]
    for name, (help_text, _) in EXAMPLES.items():
        lines.append(f"  {name:<18} {help_text}")
    lines.append("")
    lines.append("e.g.  roseinfer trace-sql profiles/trace.json --example ops-in-range --range forward")
    lines.append(
        '      roseinfer trace-sql profiles/trace.json "SELECT name, COUNT(*) n FROM slice_with_range '
        "WHERE range_name = 'sample' GROUP BY name ORDER BY n DESC\""
    )
    lines.append(
        "tables: slice, ancestor, slice_with_range, slice_thread, thread_track, thread, process, "
        "args, flow (see roseinfer/trace_sql/__init__.py)"
    )
    return "\n".join(lines)


def add_trace_sql_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="Chrome/Perfetto JSON trace (what --profile writes; .json or .json.gz)")
    parser.add_argument(
        "sql",
        nargs="?",
        default=None,
        help="SQL to run ('-' reads stdin, '@FILE' reads a file); several ';'-separated statements "
        "return the last one's rows",
    )
    parser.add_argument("--example", choices=sorted(EXAMPLES), default=None, help="run a canned query")
    parser.add_argument("--range", default="forward", help="record_function range for --example (forward)")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="perfetto trace processor, the built-in sqlite loader, or auto (perfetto only when its "
        "binary is already here; else sqlite)",
    )
    parser.add_argument(
        "--tp-bin",
        default=None,
        help=f"trace_processor_shell binary for --engine perfetto (or ${TP_BIN_ENV})",
    )
    parser.add_argument("--format", choices=sorted(FORMATS), default="table", help="output format (table)")
    parser.add_argument("--show-sql", action="store_true", help="print the SQL before the result")


def add_trace_sql_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers `trace-sql` on an argparse subparsers object; the command runs `run_trace_sql`."""
    parser = subparsers.add_parser(
        "trace-sql",
        help="run SQL over a profiler trace (slice, ancestor, slice_with_range, ...)",
        description="Run SQL over a torch profiler trace (Chrome/Perfetto JSON).",
        epilog=_examples_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_trace_sql_arguments(parser)
    parser.set_defaults(func=run_trace_sql)
    return parser


def _read_sql(args: argparse.Namespace) -> str:
    if args.example:
        if args.sql:
            raise TraceQueryError("give SQL or --example, not both")
        return example_sql(args.example, args.range)
    if args.sql is None:
        raise TraceQueryError("no SQL given\n" + _examples_help())
    if args.sql == "-":
        return sys.stdin.read()
    if args.sql.startswith("@"):
        try:
            with open(args.sql[1:], encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise TraceQueryError(f"cannot read SQL file {args.sql[1:]}: {e}") from e
    return str(args.sql)


def run_trace_sql(args: argparse.Namespace) -> int:
    try:
        sql = _read_sql(args)
        if getattr(args, "show_sql", False):
            print(sql.strip())
            print()
        columns, rows = query_trace(
            args.trace, sql, engine=getattr(args, "engine", "auto"), tp_bin=getattr(args, "tp_bin", None)
        )
    except TraceQueryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(FORMATS[getattr(args, "format", "table")](columns, rows))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m roseinfer.trace_sql")
    add_trace_sql_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["trace-sql", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))
