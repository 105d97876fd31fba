"""`kernels/pdl.py`: a kernel's PDL constexpr and its launch option come from one flag."""

from __future__ import annotations

import pytest

from roseinfer.kernels import pdl


@pytest.mark.parametrize("interpret", [False, True], ids=["gpu", "interpreter"])
@pytest.mark.parametrize("asked", [False, True], ids=["plain", "pdl"])
def test_pdl_kwargs_keep_the_constexpr_and_the_launch_option_together(monkeypatch, interpret, asked):
    monkeypatch.setattr(pdl, "is_interpret", lambda: interpret)
    kwargs = pdl.pdl_kwargs(asked)
    active = asked and not interpret  # the interpreter runs launches one after another
    assert kwargs["PDL"] is active
    assert kwargs.get("launch_pdl", False) is active
    assert set(kwargs) <= {"PDL", "launch_pdl"}
