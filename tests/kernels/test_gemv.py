"""gemv (one-token decode linear with folded norm / bias / SwiGLU / residual) against the separate ops."""

from __future__ import annotations

import itertools

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from roseinfer.kernels.gemv import gemv, gemv_ref  # noqa: E402
from tests.kernels.kernel_utils import DTYPE_IDS, assert_close, generator, randn  # noqa: E402

FLAGS = [
    f for f in itertools.product([False, True], repeat=4) if not (f[1] and f[2])
]  # norm, bias, gated, res


def _case(
    m: int, n: int, k: int, dtype: torch.dtype, flags: tuple[bool, ...], tile: tuple[int, int, int] | None
):
    norm, bias, gated, res = flags
    gen = generator("gemv", m, n, k, dtype, flags)
    rows = 2 * n if gated else n
    x = randn((m, k), dtype, gen)
    w = randn((rows, k), dtype, gen) / k**0.5
    kwargs = dict(
        bias=randn((rows,), dtype, gen) if bias else None,
        norm_weight=randn((k,), dtype, gen) if norm else None,
        gated=gated,
        residual=randn((m, n), dtype, gen) if res else None,
        eps=1e-5,
    )
    out = gemv(x, w, tile=tile, **kwargs)
    assert out.shape == (m, n)
    assert_close(out, gemv_ref(x, w, **kwargs), dtype)


@pytest.mark.parametrize(
    "flags", FLAGS, ids=lambda f: "".join("nbgr"[i] if v else "-" for i, v in enumerate(f))
)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 7, 64), (2, 33, 130), (1, 1, 5), (3, 16, 96)])
def test_gemv_flags_and_shapes(flags: tuple[bool, ...], m: int, n: int, k: int) -> None:
    _case(m, n, k, torch.float32, flags, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("tile", [(4, 32, 1), (1, 16, 1), (8, 64, 2)], ids=["bn4", "bn1", "bn8"])
def test_gemv_dtypes_and_tiles(dtype: torch.dtype, tile: tuple[int, int, int]) -> None:
    for flags in [(True, False, False, False), (True, False, True, False), (False, True, False, True)]:
        _case(1, 19, 100, dtype, flags, tile)


def test_gemv_rejects_bad_shapes() -> None:
    x = torch.zeros(1, 8)
    with pytest.raises(ValueError, match="weight"):
        gemv(x, torch.zeros(4, 9))
    with pytest.raises(ValueError, match="even"):
        gemv(x, torch.zeros(5, 8), gated=True)
    with pytest.raises(ValueError, match="residual"):
        gemv(x, torch.zeros(4, 8), residual=torch.zeros(1, 3))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("n", "k"), [(6144, 4096), (4096, 4096), (14336, 4096), (4096, 14336), (1152, 896), (896, 4864)]
)
def test_gemv_gpu_llama_and_qwen_shapes(dtype: torch.dtype, n: int, k: int) -> None:
    for flags in [(True, False, False, False), (False, False, False, True), (True, False, True, False)]:
        _case(1, n, k, dtype, flags, None)
