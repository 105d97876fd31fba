"""Which BLAS library the MLP's down GEMM asks for (`models/layers.down_blas_library`)."""

from __future__ import annotations

import torch

from roseinfer.models.layers import LT_DOWN_MIN_K, LT_DOWN_ROWS, down_blas_library, preferred_blas


def test_cublaslt_only_for_long_down_gemms_at_decode_rows_on_cuda():
    lo, hi = LT_DOWN_ROWS
    assert down_blas_library(lo, LT_DOWN_MIN_K, is_cuda=True) == "cublaslt"
    assert down_blas_library(hi, 14336, is_cuda=True) == "cublaslt"
    assert down_blas_library(lo - 1, 14336, is_cuda=True) is None  # batch 16: measured the same
    assert down_blas_library(hi + 1, 14336, is_cuda=True) is None  # batch 192 and up: cuBLASLt slower
    assert down_blas_library(64, LT_DOWN_MIN_K - 1, is_cuda=True) is None  # qwen2.5-0.5b's 4864: no faster
    assert down_blas_library(64, 14336, is_cuda=False) is None


def test_no_library_leaves_torch_preference_alone():
    before = torch.backends.cuda.preferred_blas_library()
    with preferred_blas(None):
        assert torch.backends.cuda.preferred_blas_library() == before
    assert torch.backends.cuda.preferred_blas_library() == before
