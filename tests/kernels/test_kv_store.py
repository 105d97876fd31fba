"""store_kv against the plain-torch reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from roseinfer.kernels.kv_store import store_kv, store_kv_ref  # noqa: E402
from tests.kernels.kernel_utils import DEVICE, DTYPE_IDS, generator, randn  # noqa: E402


def _check(
    num_tokens: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_blocks: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    num_pad: int = 0,
    strided_input: bool = False,
    slot_dtype: torch.dtype = torch.int64,
) -> None:
    num_layers, layer = 3, 1
    kv = torch.full(
        (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype
    )
    kv = kv.to(DEVICE)
    k_cache, v_cache = kv[:, layer, 0], kv[:, layer, 1]
    num_slots = num_blocks * block_size
    assert num_tokens <= num_slots
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    pad_at = torch.randperm(num_tokens, generator=gen)[:num_pad]
    slots[pad_at] = -1
    slots = slots.to(slot_dtype).to(DEVICE)
    if strided_input:
        # k and v as views into one fused [T, (Hq + 2 Hkv) * D] projection output.
        qkv = randn((num_tokens, (2 + 2 * num_kv_heads) * head_dim), dtype, gen)
        k = qkv[:, 2 * head_dim : (2 + num_kv_heads) * head_dim].view(num_tokens, num_kv_heads, head_dim)
        v = qkv[:, (2 + num_kv_heads) * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    else:
        k = randn((num_tokens, num_kv_heads, head_dim), dtype, gen)
        v = randn((num_tokens, num_kv_heads, head_dim), dtype, gen)

    ref = kv.clone()
    store_kv_ref(k, v, ref[:, layer, 0], ref[:, layer, 1], slots)
    store_kv(k, v, k_cache, v_cache, slots)
    # Bit-exact, NaN where nothing was written (padding rows, other slots, other layers).
    assert torch.equal(torch.isnan(kv), torch.isnan(ref))
    assert torch.equal(torch.nan_to_num(kv), torch.nan_to_num(ref))
    written = (~torch.isnan(kv)).sum().item()
    assert written == 2 * (num_tokens - num_pad) * num_kv_heads * head_dim


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("num_kv_heads", "head_dim", "block_size"),
    [(2, 64, 16), (1, 128, 1), (8, 128, 64), (3, 80, 16)],
)
def test_store_kv(dtype: torch.dtype, num_kv_heads: int, head_dim: int, block_size: int) -> None:
    gen = generator("store", dtype, num_kv_heads, head_dim, block_size)
    _check(13, num_kv_heads, head_dim, block_size, 20, dtype, gen, num_pad=3)


def test_store_kv_strided_input_and_all_padding() -> None:
    gen = generator("store-strided")
    _check(9, 2, 64, 16, 4, torch.bfloat16, gen, num_pad=2, strided_input=True)
    _check(5, 2, 64, 16, 4, torch.float32, gen, num_pad=5)
    # int32 slots, as the CUDA-graph buffers hold them.
    _check(11, 2, 32, 4, 5, torch.float16, gen, num_pad=2, slot_dtype=torch.int32)


def test_store_kv_many_heads_split_over_grid() -> None:
    # 64 heads x 128 dims is more than one program's tile: the head axis goes to the grid.
    gen = generator("store-wide")
    _check(3, 64, 128, 4, 2, torch.float16, gen, num_pad=1)


def test_store_kv_k_and_v_of_different_layouts() -> None:
    """k, v and their caches need not share strides: each is read and written through its own."""
    gen = generator("store-layouts")
    tokens, heads, dim, block_size = 7, 3, 32, 4
    k = randn((tokens, heads, dim), torch.float32, gen)
    v = randn((tokens, heads + 2, dim + 16), torch.float32, gen)[:, 1 : heads + 1, 8 : dim + 8]
    k_cache = torch.full((5, block_size, heads, dim), float("nan"), device=DEVICE)
    v_cache = torch.full((5, 2, block_size, heads + 1, dim + 8), float("nan"), device=DEVICE)[
        :, 1, :, :heads, :dim
    ]
    slots = torch.tensor([0, 5, -1, 19, 3, 8, 12], device=DEVICE)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv_ref(k, v, k_ref, v_ref, slots)
    store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(torch.nan_to_num(k_cache), torch.nan_to_num(k_ref))
    assert torch.equal(torch.nan_to_num(v_cache), torch.nan_to_num(v_ref))
    assert torch.equal(k_cache.isnan(), k_ref.isnan()) and torch.equal(v_cache.isnan(), v_ref.isnan())


def test_store_kv_empty() -> None:
    kv = torch.zeros((2, 1, 2, 4, 1, 16), device=DEVICE)
    empty = torch.empty((0, 1, 16), device=DEVICE)
    store_kv(empty, empty, kv[:, 0, 0], kv[:, 0, 1], torch.empty(0, dtype=torch.int64, device=DEVICE))
    assert torch.equal(kv, torch.zeros_like(kv))


@settings(max_examples=12, deadline=None)
@given(
    num_tokens=st.integers(1, 12),
    num_kv_heads=st.integers(1, 4),
    head_dim=st.sampled_from([16, 32, 48, 64]),
    block_size=st.sampled_from([1, 2, 16]),
    pad_frac=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_store_kv_property(
    num_tokens: int, num_kv_heads: int, head_dim: int, block_size: int, pad_frac: float, seed: int
) -> None:
    num_blocks = (num_tokens + block_size - 1) // block_size + 1
    gen = torch.Generator().manual_seed(seed)
    _check(
        num_tokens,
        num_kv_heads,
        head_dim,
        block_size,
        num_blocks,
        torch.float32,
        gen,
        int(pad_frac * num_tokens),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DTYPE_IDS.get)
def test_store_kv_gpu(dtype: torch.dtype) -> None:
    gen = generator("store-gpu", dtype)
    _check(4096, 8, 128, 16, 600, dtype, gen, num_pad=100)
    _check(300, 2, 64, 1, 512, dtype, gen, num_pad=7, strided_input=True)
