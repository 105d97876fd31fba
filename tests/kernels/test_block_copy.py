"""copy_blocks against the plain-torch reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from roseinfer.kernels.block_copy import copy_blocks, copy_blocks_ref  # noqa: E402
from tests.kernels.kernel_utils import DEVICE, DTYPE_IDS, generator, randn  # noqa: E402


def _check(shape: tuple[int, ...], num_pairs: int, dtype: torch.dtype, gen: torch.Generator) -> None:
    kv = randn(shape, dtype, gen)
    perm = torch.randperm(shape[0], generator=gen)
    src = perm[:num_pairs].to(DEVICE)
    dst = perm[num_pairs : 2 * num_pairs].to(DEVICE)
    # A source may be copied twice (two sequences fork from one block).
    if num_pairs >= 2:
        src[1] = src[0]
    ref = kv.clone()
    copy_blocks_ref(ref, src, dst)
    copy_blocks(kv, src, dst)
    assert torch.equal(kv, ref)
    untouched = torch.ones(shape[0], dtype=torch.bool, device=DEVICE)
    untouched[dst] = False
    assert torch.equal(kv[untouched], ref[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("shape", "num_pairs"),
    [
        ((8, 2, 2, 16, 2, 64), 3),  # 8192 elements a block: several programs per pair
        ((5, 1, 2, 1, 1, 16), 2),  # block size 1, tiny blocks
        ((12, 3, 2, 4, 3, 24), 5),  # odd sizes
    ],
)
def test_copy_blocks(dtype: torch.dtype, shape: tuple[int, ...], num_pairs: int) -> None:
    _check(shape, num_pairs, dtype, generator("copy", dtype, shape, num_pairs))


def test_copy_blocks_empty() -> None:
    kv = torch.ones((3, 1, 2, 4, 1, 16), device=DEVICE)
    none = torch.empty(0, dtype=torch.int64, device=DEVICE)
    copy_blocks(kv, none, none)
    assert torch.equal(kv, torch.ones_like(kv))


def test_copy_blocks_rejects_non_contiguous() -> None:
    kv = torch.ones((3, 2, 2, 4, 1, 16), device=DEVICE)[:, :1]
    idx = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError):
        copy_blocks(kv, idx, idx + 1)


@pytest.mark.gpu
def test_copy_blocks_gpu() -> None:
    gen = generator("copy-gpu")
    _check((512, 24, 2, 16, 2, 64), 100, torch.bfloat16, gen)
    _check((64, 32, 2, 16, 8, 128), 20, torch.float16, gen)
