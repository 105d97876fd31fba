"""paged_prefill_attention against the plain-torch reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from roseinfer.kernels.paged_prefill_attention import (  # noqa: E402
    paged_prefill_attention,
    paged_prefill_attention_ref,
)
from tests.kernels.kernel_utils import DEVICE, DTYPE_IDS, assert_close, generator, make_paged_cache, randn  # noqa: E402


def _run(
    q_lens: list[int],
    prefix_lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    seed_tag: str,
    block_m: int | None = None,
    block_n: int | None = None,
    pad_rows: int = 0,
) -> None:
    gen = generator(
        "prefill", seed_tag, q_lens, prefix_lens, block_size, num_heads, num_kv_heads, head_dim, dtype
    )
    seq_lens = [p + n for p, n in zip(q_lens, prefix_lens, strict=True)]
    cache = make_paged_cache(seq_lens, block_size, num_kv_heads, head_dim, dtype, gen)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    num_tokens = starts[-1] + pad_rows
    query_start_loc = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    q = randn((num_tokens, num_heads, head_dim), dtype, gen)
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))
    args = (
        cache.k_cache,
        cache.v_cache,
        cache.block_tables,
        query_start_loc,
        cache.seq_lens,
        max(q_lens),
        scale,
    )
    res = paged_prefill_attention(q, *args, out=out, block_m=block_m, block_n=block_n)
    assert res.data_ptr() == out.data_ptr()
    ref = paged_prefill_attention_ref(q, *args)
    covered = starts[-1]
    assert_close(out[:covered], ref[:covered], dtype)
    if pad_rows:
        assert torch.isnan(out[covered:]).all(), "rows outside every sequence were written"


# (q_lens, prefix_lens): full prefills, chunks after a cached prefix, one-token chunks (decodes in a mixed
# batch), lengths at and one past block boundaries and tile boundaries.
CASES = {
    "mixed": ([17, 1, 5, 16], [0, 30, 11, 16]),
    "full": ([33, 16, 1], [0, 0, 0]),
    "chunks": ([20, 3], [47, 64]),
}


@pytest.mark.parametrize("block_size", [1, 16, 64], ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("case", list(CASES))
def test_prefill_block_sizes(block_size: int, case: str) -> None:
    q_lens, prefix_lens = CASES[case]
    _run(q_lens, prefix_lens, block_size, 2, 1, 32, torch.float32, "bs")


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads"),
    [(2, 2), (4, 2), (14, 2), (3, 1)],
    ids=["mha", "gqa2", "gqa7", "mqa"],
)
def test_prefill_gqa(num_heads: int, num_kv_heads: int) -> None:
    _run([18, 1], [5, 16], 16, num_heads, num_kv_heads, 32, torch.float32, "gqa")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_dtypes_head_dims(dtype: torch.dtype, head_dim: int) -> None:
    _run([19, 2], [13, 0], 16, 2, 1, head_dim, dtype, "dtypes")


def test_prefill_non_pow2_head_dim() -> None:
    _run([17, 4], [3, 20], 16, 2, 1, 80, torch.float16, "hd80")


def test_prefill_tile_shapes_and_padding_rows() -> None:
    # BLOCK_M != BLOCK_N so the unmasked and diagonal loops split at different places.
    _run([40, 7], [9, 33], 16, 2, 1, 32, torch.float32, "tiles", block_m=32, block_n=16, pad_rows=3)
    _run([40, 7], [9, 33], 16, 2, 1, 32, torch.float32, "tiles", block_m=16, block_n=32)


@pytest.mark.parametrize("first_seq", [1, 2, 4])
def test_prefill_first_seq_leaves_earlier_sequences_alone(first_seq: int) -> None:
    q_lens, prefix_lens = [1, 1, 9, 1], [15, 16, 7, 40]
    gen = generator("prefill-first-seq", first_seq)
    cache = make_paged_cache([p + n for p, n in zip(q_lens, prefix_lens)], 16, 1, 32, torch.float32, gen)
    starts = [0, 1, 2, 11, 12]
    qsl = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    q = randn((starts[-1], 2, 32), torch.float32, gen)
    args = (cache.k_cache, cache.v_cache, cache.block_tables, qsl, cache.seq_lens, max(q_lens), 32**-0.5)
    out = torch.full_like(q, float("nan"))
    paged_prefill_attention(q, *args, out=out, first_seq=first_seq)
    ref = paged_prefill_attention_ref(q, *args)
    begin = starts[first_seq]
    assert torch.isnan(out[:begin]).all(), "rows of sequences before first_seq were written"
    if begin < starts[-1]:
        assert_close(out[begin:], ref[begin:], torch.float32)
    with pytest.raises(ValueError, match="first_seq"):
        paged_prefill_attention(q, *args, first_seq=5)


def test_prefill_strided_query() -> None:
    gen = generator("prefill-strided")
    cache = make_paged_cache([20], 16, 1, 32, torch.float16, gen)
    qkv = randn((6, (2 + 2) * 32), torch.float16, gen)
    q = qkv[:, : 2 * 32].view(6, 2, 32)
    qsl = torch.tensor([0, 6], dtype=torch.int32, device=DEVICE)
    args = (cache.k_cache, cache.v_cache, cache.block_tables, qsl, cache.seq_lens, 6, 32**-0.5)
    assert_close(paged_prefill_attention(q, *args), paged_prefill_attention_ref(q, *args), torch.float16)


# ---------------------------------------------------------------- GPU (compiled) at real sizes


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"),
    [(14, 2, 64), (32, 8, 128), (16, 16, 128), (8, 1, 64)],
    ids=["qwen0.5b", "llama8b", "mha", "mqa"],
)
@pytest.mark.parametrize("block_size", [16, 64, 1])
def test_prefill_gpu(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    q_lens = [1000, 1, 257, 64, 129, 1, 513]
    prefix_lens = [0, 700, 300, 1024, 0, 1, 17]
    _run(q_lens, prefix_lens, block_size, num_heads, num_kv_heads, head_dim, dtype, "gpu", pad_rows=5)
