"""`_common.is_interpret` reads TRITON_INTERPRET as Triton does: the tile configs, PDL, the dot types and the
shared-memory cap follow the interpreter exactly when Triton runs it ("false" once meant interpret here,
while Triton compiled)."""

from __future__ import annotations

import pytest
import triton

from roseinfer.kernels import _common


@pytest.mark.parametrize("value", ["1", "0", "", "true", "false", "off", "no", "yes", "on", "2", "TRUE"])
def test_is_interpret_reads_the_flag_as_triton_does(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """The configs, PDL and the dot types follow the interpreter exactly when Triton runs it."""
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert _common.is_interpret() is triton.knobs.runtime.interpret
