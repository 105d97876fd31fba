"""`bench fused`: each op's Triton call and torch reference see fresh inputs and agree (timer and torch.compile
stubbed; the GPU test runs them for real)."""

from __future__ import annotations

import math
import os

import pytest
import torch

import roseinfer.bench.fused_ops as fused
from roseinfer.config import ModelConfig
from tests.kernels.kernel_utils import DEVICE


@pytest.fixture
def qwen() -> ModelConfig:
    return ModelConfig.from_path(os.path.join(fused.BUILTIN_CONFIG_DIR, "qwen2.5-0.5b.json"))


@pytest.mark.parametrize("make", fused.CASES, ids=lambda m: m.__name__)
def test_each_case_compares_fresh_inputs(make, qwen, monkeypatch):
    calls = []
    monkeypatch.setattr(fused, "_graph_back_to_back_ms", lambda fn, n: (calls.append(n), fn(), 0.5)[-1])
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    with torch.inference_mode():
        row = fused.bench_case(make(qwen, 3, torch.Generator(DEVICE).manual_seed(0)), copy_bytes_per_s=1e12)
    # In-place ops (the residual, rotary's q and k) would compare a twice-applied op if inputs were shared.
    assert row["err_triton"] < 0.1 and row["err_compiled"] == 0.0, row
    assert calls == [fused.LAUNCHES] * 3
    assert row["triton_us"] == row["eager_us"] == 500.0 and row["fastest"] == "triton"
    assert math.isclose(row["floor_us"], make(qwen, 3, torch.Generator()).nbytes / 1e6)


def test_shared_inputs_would_be_caught(qwen):
    case = fused._rotary_case(qwen, 3, torch.Generator(DEVICE).manual_seed(0))
    shared = case.inputs()
    ours = case.triton(*shared)
    twice = case.reference(*shared)  # rotates the already rotated q and k
    assert fused._max_err(ours, twice) > 0.1
