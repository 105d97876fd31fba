"""Query results as text: an aligned Markdown table, CSV or JSON."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from typing import Any


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        if value == int(value) and abs(value) < 1e15:
            return str(int(value))
        if abs(value) >= 1e-3:
            return f"{value:.6f}".rstrip("0").rstrip(".")
        return f"{value:.4g}"
    if isinstance(value, bytes):
        return value.hex()
    return str(value).replace("\n", " ").replace("|", "\\|")


def format_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (aligned), numbers right-aligned, then a row count."""
    cells = [[_cell(v) for v in row] for row in rows]
    if not columns:
        return f"({len(cells)} rows)"
    header = [str(c).replace("|", "\\|") for c in columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells if i < len(r)]) for i, h in enumerate(header)]
    numeric = [
        bool(cells) and all(i < len(r) and (r[i] == "NULL" or _is_number(r[i])) for r in cells)
        for i in range(len(header))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [(v.rjust(w) if num else v.ljust(w)) for v, w, num in zip(values, widths, numeric)]
        return "| " + " | ".join(parts) + " |"

    sep = (
        "|"
        + "|".join(("-" * (w + 1) + ":") if num else "-" * (w + 2) for w, num in zip(widths, numeric))
        + "|"
    )
    out = [line(header), sep, *(line(r) for r in cells)]
    out.append(f"({len(cells)} row{'s' if len(cells) != 1 else ''})")
    return "\n".join(out)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def format_csv(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buf.getvalue().rstrip("\n")


def format_json(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    return json.dumps([dict(zip(columns, r)) for r in rows], indent=1, default=str)


FORMATS = {"table": format_table, "csv": format_csv, "json": format_json}
