"""Stand-in `perfetto.trace_processor` modules, for trace SQL tests on machines without the perfetto package."""

from __future__ import annotations

import sys
import types

import pytest


def install_fake_perfetto(monkeypatch: pytest.MonkeyPatch, processor: type) -> None:
    """Makes `import perfetto.trace_processor` give `processor` as its TraceProcessor (undone after the test)."""
    tp = types.ModuleType("perfetto.trace_processor")
    tp.TraceProcessor = processor  # type: ignore[attr-defined]
    tp.TraceProcessorConfig = lambda bin_path=None: types.SimpleNamespace(bin_path=bin_path)  # type: ignore[attr-defined]
    pkg = types.ModuleType("perfetto")
    pkg.trace_processor = tp  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "perfetto", pkg)
    monkeypatch.setitem(sys.modules, "perfetto.trace_processor", tp)
