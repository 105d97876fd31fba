"""paged_decode_attention against the plain-torch reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from roseinfer.kernels.decode_new_token import DeferredNorm, NewTokenKV  # noqa: E402
from roseinfer.kernels.paged_decode_attention import (  # noqa: E402
    paged_decode_attention,
    paged_decode_attention_ref,
)
from roseinfer.kernels.paged_decode_split import choose_num_splits, decode_order, live_counters  # noqa: E402
from roseinfer.kernels.pdl import pdl_supported
from roseinfer.kernels.rmsnorm import scale_by_inv_rms_ref  # noqa: E402
from roseinfer.kernels.rotary import apply_rotary_ref  # noqa: E402
from roseinfer.kv.cache_dtype import to_cache_dtype  # noqa: E402
from roseinfer.models.layers import RotaryEmbedding  # noqa: E402
from tests.kernels.kernel_utils import (  # noqa: E402
    DEVICE,
    DTYPE_IDS,
    FP8_DTYPES,
    assert_close,
    assert_fp8_close,
    generator,
    head_major_copy,
    make_paged_cache,
    randn,
)


def _order(seq_lens: list[int], kind: str | None, gen: torch.Generator) -> torch.Tensor | None:
    """The rows' serving order: None (row order), "longest" (the engine's) or "shuffled"."""
    if kind is None:
        return None
    if kind == "longest":
        return torch.from_numpy(decode_order(np.array(seq_lens))).to(DEVICE)
    return torch.randperm(len(seq_lens), generator=gen).int().to(DEVICE)


def _run(
    seq_lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    num_splits: int | None,
    seed_tag: str,
    order: str | None = None,
    cache_dtype: torch.dtype | None = None,
    q_beyond_fp16: bool = False,
) -> None:
    """`cache_dtype`: the KV cache's element type where it is not `dtype` (fp8). `q_beyond_fp16`: some query
    elements at +-1e5, which the kernel clamps to fp16's range where its dots run in fp16 (so does the reference)."""
    gen = generator(
        "decode", seed_tag, seq_lens, block_size, num_heads, num_kv_heads, head_dim, dtype, num_splits, order,
        cache_dtype,
    )  # fmt: skip
    cache = make_paged_cache(seq_lens, block_size, num_kv_heads, head_dim, cache_dtype or dtype, gen)
    q = randn((len(seq_lens), num_heads, head_dim), dtype, gen)
    if q_beyond_fp16:
        q[::3, :, 0], q[1::3, :, 1] = 1e5, -1e5
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))
    res = paged_decode_attention(
        q,
        cache.k_cache,
        cache.v_cache,
        cache.block_tables,
        cache.seq_lens,
        scale,
        out=out,
        num_splits=num_splits,
        order=_order(seq_lens, order, gen),
    )
    assert res.data_ptr() == out.data_ptr()
    q_ref = q.clamp(-65504, 65504) if q_beyond_fp16 else q
    ref = paged_decode_attention_ref(
        q_ref, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, scale
    )
    assert_close(out, ref, dtype)


# Lengths: 1, odd, exactly at and one past block boundaries, and across several 32-key tiles.
@pytest.mark.parametrize(
    ("block_size", "seq_lens"),
    [
        (1, [1, 7, 33]),
        (16, [16, 17, 1, 45]),
        (64, [64, 65, 3]),
    ],
    ids=["bs1", "bs16", "bs64"],
)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads"),
    [(2, 2), (4, 2), (14, 2), (4, 1)],
    ids=["mha", "gqa2", "gqa7", "mqa"],
)
def test_decode_shapes(block_size: int, seq_lens: list[int], num_heads: int, num_kv_heads: int) -> None:
    _run(seq_lens, block_size, num_heads, num_kv_heads, 64, torch.float32, None, "shapes")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("head_dim", [64, 128, 32])
def test_decode_dtypes_head_dims(dtype: torch.dtype, head_dim: int) -> None:
    _run([5, 40], 16, 6, 2, head_dim, dtype, 2, "dtypes")


def test_decode_non_pow2_head_dim() -> None:
    _run([9, 33], 16, 4, 2, 80, torch.float16, 1, "hd80")


@pytest.mark.parametrize("num_splits", [1, 2, 3, 5, 16])
def test_decode_splits(num_splits: int) -> None:
    # 16 splits of sequences this short leaves most splits empty; all must merge to the same result.
    _run([1, 70, 130, 32], 16, 4, 2, 64, torch.float32, num_splits, "splits")


@pytest.mark.parametrize("order", ["longest", "shuffled"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_order(order: str, num_splits: int) -> None:
    _run([1, 70, 130, 32, 0, 17], 16, 14, 2, 64, torch.bfloat16, num_splits, "order", order)


def test_decode_order_names_each_program_s_row() -> None:
    """Row r's programs serve sequence order[r]: an order that names row 0 twice leaves row 1 unwritten."""
    gen = generator("decode-order-rows")
    cache = make_paged_cache([20, 45, 9], 16, 2, 64, torch.float32, gen)
    q = randn((3, 4, 64), torch.float32, gen)
    ref = paged_decode_attention_ref(
        q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125
    )
    for splits in (1, 2):
        out = torch.full_like(q, float("nan"))
        order = torch.tensor([2, 0, 0], dtype=torch.int32, device=DEVICE)
        paged_decode_attention(
            q,
            cache.k_cache,
            cache.v_cache,
            cache.block_tables,
            cache.seq_lens,
            0.125,
            out,
            splits,
            order=order,
        )
        assert out[1].isnan().all()
        assert_close(out[[0, 2]], ref[[0, 2]], torch.float32)


def test_decode_order_checks_shape() -> None:
    cache = make_paged_cache([3, 4], 16, 2, 64, torch.float32, generator("decode-order-bad"))
    q = torch.zeros((2, 4, 64), device=DEVICE)
    for bad in (torch.zeros(3, dtype=torch.int32), torch.zeros(2, dtype=torch.int64)):
        with pytest.raises(ValueError, match="order must be int32"):
            paged_decode_attention(
                q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 1.0, order=bad.to(DEVICE)
            )


def test_decode_order_is_longest_first() -> None:
    lens = np.array([5, 900, 5, 0, 17, 900], np.int32)
    order = decode_order(lens)
    assert order.dtype == np.int32
    assert order.tolist() == [1, 5, 4, 0, 2, 3]  # ties keep their row order
    assert decode_order(np.zeros(0, np.int32)).shape == (0,)


def test_decode_zero_length_sequence_gives_zeros() -> None:
    gen = generator("decode-zero")
    cache = make_paged_cache([0, 20], 16, 2, 64, torch.float32, gen)
    q = randn((2, 4, 64), torch.float32, gen)
    for splits in (1, 3):
        out = paged_decode_attention(
            q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125, num_splits=splits
        )
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        ref = paged_decode_attention_ref(
            q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125
        )
        assert_close(out, ref, torch.float32)


def test_decode_strided_query() -> None:
    """q as a view into a fused qkv buffer (row stride larger than heads * head_dim)."""
    gen = generator("decode-strided")
    cache = make_paged_cache([17, 3], 16, 2, 64, torch.bfloat16, gen)
    qkv = randn((2, (4 + 2 * 2) * 64), torch.bfloat16, gen)
    q = qkv[:, : 4 * 64].view(2, 4, 64)
    out = paged_decode_attention(q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125)
    ref = paged_decode_attention_ref(
        q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125
    )
    assert_close(out, ref, torch.bfloat16)


def test_choose_num_splits() -> None:
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    assert choose_num_splits(4096, 8, 4096, dev) == 1  # the batch alone fills the GPU
    assert choose_num_splits(1, 1, 100, dev) == 1  # too short to split
    few = choose_num_splits(1, 2, 32768, dev)
    assert few > 1
    assert choose_num_splits(1, 2, 32768, dev) >= choose_num_splits(8, 2, 32768, dev)


# ---------------------------------------------------------------- the step's own token (new_kv)


def _run_append(
    seq_lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    num_splits: int | None,
    rope: bool,
    seed_tag: str,
    deferred_norm: str | None = None,
    order: str | None = None,
    pdl: bool = False,
    cache_dtype: torch.dtype | None = None,
) -> None:
    """Key seq_len-1 of each sequence is the new token: NaN in the cache before the launch (the kernel must
    not read it), given unrotated in new_kv, and expected rotated in its slot afterwards.

    deferred_norm "bias" / "nobias": q, k and v are handed over unfinished (`DeferredNorm`): projections of
    rows far from unit rms, before their norm; the kernel must scale them by 1 / rms and add the bias.
    `pdl`: launched as a PDL chain's member (off the GPU, where there is no PDL, only its code layout).
    `cache_dtype`: the KV cache's element type where it is not `dtype` (fp8): the new token lands rounded, and
    attention must use it as rounded, as the reference reads it back."""
    gen = generator(
        "append", seed_tag, seq_lens, block_size, num_heads, num_kv_heads, head_dim, dtype, num_splits,
        deferred_norm, cache_dtype,
    )  # fmt: skip
    cache = make_paged_cache(seq_lens, block_size, num_kv_heads, head_dim, cache_dtype or dtype, gen)
    batch = len(seq_lens)
    lens = torch.tensor(seq_lens)
    last = (lens - 1).clamp(min=0)
    tables = cache.block_tables.cpu().long()
    slots = torch.where(
        lens > 0, tables[torch.arange(batch), last // block_size] * block_size + last % block_size, -1
    )
    blk, off = (slots.clamp(min=0) // block_size).to(DEVICE), (slots.clamp(min=0) % block_size).to(DEVICE)
    # The new tokens' K/V live in a fused qkv-like buffer (strided views), as the model hands them over.
    qkv = randn((batch, (num_heads + 2 * num_kv_heads) * head_dim), dtype, gen)
    q = qkv[:, : num_heads * head_dim].view(batch, num_heads, head_dim)
    k_new = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(
        batch, num_kv_heads, head_dim
    )
    v_new = qkv[:, (num_heads + num_kv_heads) * head_dim :].view(batch, num_kv_heads, head_dim)
    norm = None
    q_fin, k_fin, v_fin = q, k_new, v_new  # q, k, v as the reference sees them
    if deferred_norm is not None:
        rows = 30 * randn((batch + 1, 3 * head_dim + 5), dtype, gen)  # an odd hidden size; a padding row
        bias = randn((qkv.shape[1],), dtype, gen) if deferred_norm == "bias" else None
        norm = DeferredNorm(rows, 1e-6, bias)
        fin = scale_by_inv_rms_ref(qkv, rows[:batch], 1e-6, bias)
        q_fin = fin[:, : num_heads * head_dim].view(batch, num_heads, head_dim)
        k_fin = fin[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(
            batch, num_kv_heads, head_dim
        )
        v_fin = fin[:, (num_heads + num_kv_heads) * head_dim :].view(batch, num_kv_heads, head_dim)
    has = (lens > 0).to(DEVICE)
    cache.k_cache[blk[has], off[has]] = float("nan")
    cache.v_cache[blk[has], off[has]] = float("nan")
    positions = last.to(torch.int32).to(DEVICE)
    rot = RotaryEmbedding(head_dim, max(seq_lens) + 1, 10000.0, None)
    rot.build(DEVICE)
    assert rot.cos_sin is not None
    q_ref, k_ref = (
        apply_rotary_ref(q_fin, k_fin, positions, rot.cos_sin) if rope else (q_fin.clone(), k_fin.clone())
    )
    before = cache.kv.clone()
    qkv_before = qkv.clone()

    new_kv = NewTokenKV(
        k_new, v_new, slots.to(torch.int32).to(DEVICE), (positions, rot.cos_sin) if rope else None, norm
    )
    scale = head_dim**-0.5
    out = paged_decode_attention(
        q,
        cache.k_cache,
        cache.v_cache,
        cache.block_tables,
        cache.seq_lens,
        scale,
        num_splits=num_splits,
        new_kv=new_kv,
        order=_order(seq_lens, order, gen),
        pdl=pdl,
    )

    assert torch.equal(qkv, qkv_before), "q, k and v of the step must be left as they were"
    written = cache.kv.to(torch.float32, copy=True)
    written[blk[has], 1, 0, off[has]] = float("nan")
    written[blk[has], 1, 1, off[has]] = float("nan")
    # Nothing else written.
    torch.testing.assert_close(written, before.float(), equal_nan=True, atol=0, rtol=0)
    k_got, v_got = cache.k_cache[blk[has], off[has]], cache.v_cache[blk[has], off[has]]
    if cache_dtype is not None:
        # The kernel rounds its fp32 k (and a finished v) to fp8 once; the reference went through `dtype`.
        assert_fp8_close(k_got, k_ref[has])
        if norm is None:
            assert torch.equal(v_got.float(), to_cache_dtype(v_new[has], cache_dtype).float())
        else:
            assert_fp8_close(v_got, v_fin[has])
    else:
        assert_close(k_got, k_ref[has], dtype)
        if norm is None:
            assert torch.equal(v_got, v_new[has])
        else:  # finished in the kernel: its 1 / rms may differ from the reference's in the last bit
            assert_close(v_got, v_fin[has], dtype)
    ref_k, ref_v = cache.k_cache.clone(), cache.v_cache.clone()
    ref = paged_decode_attention_ref(q_ref, ref_k, ref_v, cache.block_tables, cache.seq_lens, scale)
    assert_close(out, ref, dtype)
    counters = live_counters(DEVICE)
    assert counters is None or not counters.any(), "the merge tickets must be left at zero"


@pytest.mark.parametrize(
    ("block_size", "seq_lens"),
    [(1, [1, 7, 33]), (16, [16, 17, 1, 45]), (64, [64, 65, 3])],
    ids=["bs1", "bs16", "bs64"],
)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads"), [(4, 2), (14, 2), (4, 1)], ids=["gqa2", "gqa7", "mqa"]
)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_new_token(
    block_size: int, seq_lens: list[int], num_heads: int, num_kv_heads: int, num_splits: int
) -> None:
    _run_append(seq_lens, block_size, num_heads, num_kv_heads, 64, torch.float32, num_splits, True, "shapes")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("head_dim", [64, 128, 32, 80])
@pytest.mark.parametrize("rope", [True, False], ids=["rope", "norope"])
def test_decode_new_token_dtypes(dtype: torch.dtype, head_dim: int, rope: bool) -> None:
    _run_append([5, 40, 16, 0], 16, 6, 2, head_dim, dtype, 2, rope, "dtypes")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("deferred_norm", ["bias", "nobias"])
@pytest.mark.parametrize("rope", [True, False], ids=["rope", "norope"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_new_token_deferred_norm(
    dtype: torch.dtype, deferred_norm: str, rope: bool, num_splits: int
) -> None:
    _run_append([5, 40, 16, 0, 33], 16, 14, 2, 64, dtype, num_splits, rope, "norm", deferred_norm)


def test_decode_new_token_deferred_norm_checks_shapes() -> None:
    q = torch.zeros((2, 4, 16), device=DEVICE)
    kv = torch.zeros((4, 16, 2, 16), device=DEVICE)
    tables = torch.zeros((2, 1), dtype=torch.int32, device=DEVICE)
    lens = torch.ones(2, dtype=torch.int32, device=DEVICE)
    k = torch.zeros((2, 2, 16), device=DEVICE)
    slots = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    for norm, match in (
        (DeferredNorm(torch.zeros((1, 32), device=DEVICE), 1e-6), "norm.x"),
        (DeferredNorm(torch.zeros((2, 32), device=DEVICE), 1e-6, torch.zeros(7, device=DEVICE)), "norm.bias"),
    ):
        with pytest.raises(ValueError, match=match):
            paged_decode_attention(q, kv, kv, tables, lens, 1.0, new_kv=NewTokenKV(k, k, slots, None, norm))


@pytest.mark.parametrize("rope", [True, False], ids=["rope", "norope"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_new_token_stored_in_slot_zero(rope: bool, num_splits: int) -> None:
    """Block 0 is an ordinary block (the pool hands it out first): a sequence whose new token's slot is 0 must
    have it stored there (`make_paged_cache` keeps block 0 for unused table entries, so `_run_append` never
    writes slot 0)."""
    gen = generator("decode-slot0", rope, num_splits)
    block_size, num_heads, num_kv_heads, head_dim = 16, 4, 2, 32
    cache = make_paged_cache([1, 20], block_size, num_kv_heads, head_dim, torch.float32, gen)
    # Move sequence 0's one block to block 0; its new token (key 0) is NaN until the kernel writes it.
    old = int(cache.block_tables[0, 0])
    cache.kv[0] = cache.kv[old]
    cache.kv[old] = float("nan")
    cache.block_tables[0, 0] = 0
    cache.k_cache[0, 0] = float("nan")
    cache.v_cache[0, 0] = float("nan")
    last = int(cache.block_tables[1, 1]) * block_size + 3  # sequence 1's key 19
    cache.k_cache[last // block_size, last % block_size] = float("nan")
    cache.v_cache[last // block_size, last % block_size] = float("nan")
    q = randn((2, num_heads, head_dim), torch.float32, gen)
    k_new = randn((2, num_kv_heads, head_dim), torch.float32, gen)
    v_new = randn((2, num_kv_heads, head_dim), torch.float32, gen)
    positions = torch.tensor([0, 19], dtype=torch.int32, device=DEVICE)
    rot = RotaryEmbedding(head_dim, 32, 10000.0, None)
    rot.build(DEVICE)
    assert rot.cos_sin is not None
    q_ref, k_ref = apply_rotary_ref(q, k_new, positions, rot.cos_sin) if rope else (q, k_new)
    slots = torch.tensor([0, last], dtype=torch.int32, device=DEVICE)
    new_kv = NewTokenKV(k_new, v_new, slots, (positions, rot.cos_sin) if rope else None)
    out = paged_decode_attention(
        q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125, num_splits=num_splits,
        new_kv=new_kv,
    )  # fmt: skip
    assert_close(cache.k_cache[[0, last // block_size], [0, 3]], k_ref, torch.float32)
    assert torch.equal(cache.v_cache[[0, last // block_size], [0, 3]], v_new)
    ref = paged_decode_attention_ref(
        q_ref, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125
    )
    assert_close(out, ref, torch.float32)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_new_token_longest_first(num_splits: int) -> None:
    _run_append(
        [5, 40, 16, 0, 33, 1], 16, 14, 2, 64, torch.bfloat16, num_splits, True, "lpt", "bias", "longest"
    )


@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_new_token_pdl_layout(block_size: int, num_splits: int) -> None:
    """The PDL variant (the layer input's 1 / rms and the rotary table read before its wait) at splits whose
    share is partial, empty (lengths 0-5 at 3 splits) or the only one."""
    lens = [5, 40, 16, 0, 33, 1, 65]
    _run_append(lens, block_size, 14, 2, 64, torch.bfloat16, num_splits, True, "pdl", "bias", "longest", True)
    _run_append(lens, block_size, 4, 2, 32, torch.float32, num_splits, False, "pdl", None, None, True)


def test_decode_new_token_twice_in_a_row() -> None:
    """Back-to-back split launches reuse the merge tickets: each must leave them at zero."""
    for i in range(3):
        _run_append([300, 2, 129], 16, 4, 2, 64, torch.float32, 5, True, f"again{i}")


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_fp8_cache(cache_dtype: torch.dtype, dtype: torch.dtype, num_splits: int) -> None:
    """An fp8 cache is read back widened to the queries' dtype: the same attention as the reference's over
    the same (rounded) keys and values, at block and tile boundaries."""
    _run([1, 16, 17, 45, 33], 16, 14, 2, 64, dtype, num_splits, "fp8", "longest", cache_dtype)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_fp8_cache_clamps_bf16_queries_to_fp16(num_splits: int) -> None:
    """bf16 queries over an fp8 cache meet K/V in fp16 dots: elements past fp16's range are clamped, not inf."""
    _run(
        [1, 16, 17, 45, 33], 16, 14, 2, 64, torch.bfloat16, num_splits, "fp8big", "longest", torch.float8_e4m3fn,
        q_beyond_fp16=True,
    )  # fmt: skip


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("rope", [True, False], ids=["rope", "norope"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_new_token_fp8_cache(
    cache_dtype: torch.dtype, dtype: torch.dtype, rope: bool, num_splits: int
) -> None:
    _run_append([5, 40, 16, 0, 33], 16, 14, 2, 64, dtype, num_splits, rope, "fp8", cache_dtype=cache_dtype)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_new_token_fp8_cache_deferred_norm_pdl(num_splits: int) -> None:
    """The decode chain's member as an fp8 engine runs it: finished in the kernel, longest first, PDL layout."""
    _run_append(
        [5, 40, 16, 0, 33, 1, 65], 16, 14, 2, 64, torch.bfloat16, num_splits, True, "fp8pdl", "bias", "longest",
        True, torch.float8_e4m3fn,
    )  # fmt: skip


def test_decode_rejects_a_cache_of_another_dtype() -> None:
    q = torch.zeros((1, 4, 16), dtype=torch.bfloat16, device=DEVICE)
    kv = torch.zeros((4, 16, 2, 16), dtype=torch.float16, device=DEVICE)
    tables = torch.zeros((1, 1), dtype=torch.int32, device=DEVICE)
    lens = torch.ones(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="KV cache must be torch.bfloat16"):
        paged_decode_attention(q, kv, kv, tables, lens, 1.0)


# ---------------------------------------------------------------- GPU (compiled) at real sizes


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"),
    [(14, 2, 64), (32, 8, 128), (32, 32, 128), (16, 1, 128), (28, 4, 128)],
    ids=["qwen0.5b", "llama8b", "mha", "mqa", "gqa7"],
)
@pytest.mark.parametrize("block_size", [16, 64, 1])
def test_decode_gpu(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    gen = generator("decode-gpu", dtype, num_heads, num_kv_heads, head_dim, block_size)
    lens = torch.randint(1, 3000, (24,), generator=gen).tolist() + [1, block_size, block_size + 1, 4096]
    for splits in (None, 1, 7):
        # Row order at one split, the engine's longest-first order otherwise.
        order = None if splits == 1 else "longest"
        _run(lens, block_size, num_heads, num_kv_heads, head_dim, dtype, splits, f"gpu{splits}", order)


@pytest.mark.gpu
def test_decode_gpu_few_long_sequences_split() -> None:
    """Two 32k-token sequences: the automatic split count must be > 1 and match the reference."""
    lens = [32768, 30001]
    assert choose_num_splits(2, 8, 32768, DEVICE) > 1
    _run(lens, 16, 32, 8, 128, torch.bfloat16, None, "long")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"),
    [(14, 2, 64), (32, 8, 128), (16, 1, 128)],
    ids=["qwen0.5b", "llama8b", "mqa"],
)
def test_decode_new_token_gpu(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    gen = generator("decode-new-gpu", dtype, num_heads, num_kv_heads, head_dim)
    lens = torch.randint(1, 3000, (24,), generator=gen).tolist() + [1, 16, 17, 4096, 0]
    for splits in (None, 1, 7):
        _run_append(lens, 16, num_heads, num_kv_heads, head_dim, dtype, splits, True, f"gpu{splits}")
        # Finished in the kernel (deferred norm), longest first; as a lone PDL launch too (its wait returns
        # at once), where the GPU has PDL.
        for pdl in (False, True) if pdl_supported(DEVICE) else (False,):
            _run_append(
                lens, 16, num_heads, num_kv_heads, head_dim, dtype, splits, True, f"gpu{splits}", "bias", "longest", pdl
            )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"),
    [(14, 2, 64), (32, 8, 128), (16, 8, 128)],
    ids=["qwen0.5b", "llama8b", "qwen3"],
)
def test_decode_fp8_cache_gpu(
    cache_dtype: torch.dtype, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    gen = generator("decode-fp8-gpu", cache_dtype, dtype, num_heads, num_kv_heads, head_dim)
    lens = torch.randint(1, 3000, (24,), generator=gen).tolist() + [1, 16, 17, 4096, 0]
    for splits in (None, 1, 7):
        order = None if splits == 1 else "longest"
        _run(
            lens, 16, num_heads, num_kv_heads, head_dim, dtype, splits, f"fp8gpu{splits}", order, cache_dtype
        )
        _run_append(
            lens, 16, num_heads, num_kv_heads, head_dim, dtype, splits, True, f"fp8gpu{splits}",
            cache_dtype=cache_dtype,
        )  # fmt: skip
        for pdl in (False, True) if pdl_supported(DEVICE) else (False,):
            _run_append(
                lens, 16, num_heads, num_kv_heads, head_dim, dtype, splits, True, f"fp8gpu{splits}", "bias",
                "longest", pdl, cache_dtype,
            )  # fmt: skip


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_v_cache_of_another_layout(num_splits: int) -> None:
    """k and v are read through their own strides: nothing but the same shape ties the two caches."""
    gen = generator("decode-v-layout", num_splits)
    cache = make_paged_cache([5, 40, 17], 16, 2, 32, torch.float32, gen)
    q = randn((3, 4, 32), torch.float32, gen)
    v_cache = head_major_copy(cache.v_cache)
    got = paged_decode_attention(
        q, cache.k_cache, v_cache, cache.block_tables, cache.seq_lens, 32**-0.5, num_splits=num_splits
    )
    want = paged_decode_attention_ref(
        q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 32**-0.5
    )
    assert_close(got, want, torch.float32)
