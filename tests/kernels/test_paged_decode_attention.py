"""paged_decode_attention against the plain-torch reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from roseinfer.kernels._common import num_sms  # noqa: E402
from roseinfer.kernels.paged_decode_attention import (  # noqa: E402
    MAX_SPLITS,
    PROGRAMS_PER_SM,
    VARIANTS,
    choose_num_splits,
    choose_num_splits_all_heads,
    choose_variant,
    paged_decode_attention,
    paged_decode_attention_ref,
)
from tests.kernels.kernel_utils import DEVICE, DTYPE_IDS, assert_close, generator, make_paged_cache, randn  # noqa: E402


def _run(
    seq_lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    num_splits: int | None,
    seed_tag: str,
    variant: str | None = None,
) -> None:
    gen = generator(
        "decode",
        seed_tag,
        seq_lens,
        block_size,
        num_heads,
        num_kv_heads,
        head_dim,
        dtype,
        num_splits,
        variant,
    )
    cache = make_paged_cache(seq_lens, block_size, num_kv_heads, head_dim, dtype, gen)
    q = randn((len(seq_lens), num_heads, head_dim), dtype, gen)
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
        variant=variant,
    )
    assert res.data_ptr() == out.data_ptr()
    ref = paged_decode_attention_ref(
        q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, scale
    )
    assert_close(out, ref, dtype)


# Lengths: 1, odd, exactly at and one past block boundaries, and across several 32-key tiles.
@pytest.mark.parametrize("variant", VARIANTS)
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
def test_decode_shapes(
    block_size: int, seq_lens: list[int], num_heads: int, num_kv_heads: int, variant: str
) -> None:
    _run(seq_lens, block_size, num_heads, num_kv_heads, 64, torch.float32, None, "shapes", variant)


# Narrow kv heads (Hkv * D <= 256, the all-heads variant's target) at both variants. Under the interpreter
# the all-heads tile is 16 keys: block size 16 takes its one-block-per-tile path, 1 and 4 its per-key block
# lookup. (6, 3) has a row width 3 * D that is not a power of two (masked columns).
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    ("block_size", "seq_lens"),
    [
        (1, [1, 16, 17, 33]),
        (4, [4, 5, 0, 37]),
        (16, [16, 17, 1, 49]),
    ],
    ids=["bs1", "bs4", "bs16"],
)
@pytest.mark.parametrize("head_dim", [16, 32, 64])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads"),
    [(7, 1), (4, 2), (2, 2), (4, 1), (6, 3)],
    ids=["gqa7", "gqa2", "mha", "mqa", "kv3"],
)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_narrow_heads(
    block_size: int,
    seq_lens: list[int],
    head_dim: int,
    num_heads: int,
    num_kv_heads: int,
    num_splits: int,
    variant: str,
) -> None:
    assert num_kv_heads * head_dim <= 256
    _run(
        seq_lens, block_size, num_heads, num_kv_heads, head_dim, torch.float32, num_splits, "narrow", variant
    )


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("head_dim", [64, 128, 32])
def test_decode_dtypes_head_dims(dtype: torch.dtype, head_dim: int, variant: str) -> None:
    _run([5, 40], 16, 6, 2, head_dim, dtype, 2, "dtypes", variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_decode_qwen_like_heads(dtype: torch.dtype, variant: str) -> None:
    """Qwen2.5-0.5B's head shape (14 q / 2 kv, D=64), direct and split."""
    for splits in (1, 2):
        _run([31, 64, 65, 1], 16, 14, 2, 64, dtype, splits, "qwen", variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_non_pow2_head_dim(variant: str) -> None:
    _run([9, 33], 16, 4, 2, 80, torch.float16, 1, "hd80", variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 5, 16])
def test_decode_splits(num_splits: int, block_size: int, variant: str) -> None:
    # 16 splits of sequences this short leaves most splits empty; all must merge to the same result.
    _run([1, 70, 130, 32], block_size, 4, 2, 64, torch.float32, num_splits, "splits", variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_zero_length_sequence_gives_zeros(variant: str) -> None:
    gen = generator("decode-zero", variant)
    cache = make_paged_cache([0, 20], 16, 2, 64, torch.float32, gen)
    q = randn((2, 4, 64), torch.float32, gen)
    for splits in (1, 3):
        out = paged_decode_attention(
            q,
            cache.k_cache,
            cache.v_cache,
            cache.block_tables,
            cache.seq_lens,
            0.125,
            num_splits=splits,
            variant=variant,
        )
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        ref = paged_decode_attention_ref(
            q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125
        )
        assert_close(out, ref, torch.float32)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_strided_query(variant: str) -> None:
    """q as a view into a fused qkv buffer (row stride larger than heads * head_dim)."""
    gen = generator("decode-strided", variant)
    cache = make_paged_cache([17, 3], 16, 2, 64, torch.bfloat16, gen)
    qkv = randn((2, (4 + 2 * 2) * 64), torch.bfloat16, gen)
    q = qkv[:, : 4 * 64].view(2, 4, 64)
    out = paged_decode_attention(
        q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125, variant=variant
    )
    ref = paged_decode_attention_ref(
        q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.125
    )
    assert_close(out, ref, torch.bfloat16)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_output_rows_of_a_larger_buffer(variant: str) -> None:
    """out as the first rows of a bigger buffer (as the backend passes it): the rows after stay untouched."""
    gen = generator("decode-out-view", variant)
    cache = make_paged_cache([23, 8, 40], 4, 2, 32, torch.float32, gen)
    q = randn((3, 6, 32), torch.float32, gen)
    buf = torch.full((5, 6, 32), float("nan"), device=q.device)
    for splits in (1, 2):
        paged_decode_attention(
            q,
            cache.k_cache,
            cache.v_cache,
            cache.block_tables,
            cache.seq_lens,
            0.2,
            out=buf[:3],
            num_splits=splits,
            variant=variant,
        )
        ref = paged_decode_attention_ref(
            q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.2
        )
        assert_close(buf[:3], ref, torch.float32)
        assert torch.isnan(buf[3:]).all()


def test_choose_variant() -> None:
    assert choose_variant(14, 2, 64) == "all_heads"  # Qwen2.5-0.5B
    assert choose_variant(32, 8, 128) == "per_head"  # Llama-3.1-8B
    assert choose_variant(28, 4, 128) == "per_head"  # Qwen2.5-7B: 512-wide rows
    assert choose_variant(64, 2, 128) == "all_heads"  # at both limits
    assert choose_variant(128, 2, 64) == "per_head"  # too many query heads for one tile
    assert choose_variant(8, 1, 512) == "per_head"


def _recording_launchers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    import roseinfer.kernels.paged_decode_attention as mod

    calls: list[str] = []
    for name, variant in (("_launch_per_head", "per_head"), ("_launch_all_heads", "all_heads")):
        original = getattr(mod, name)

        def record(*args: object, _original=original, _variant=variant) -> None:  # type: ignore[no-untyped-def]
            calls.append(_variant)
            _original(*args)

        monkeypatch.setattr(mod, name, record)
    return calls


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "expected"),
    [(14, 2, 64, "all_heads"), (32, 8, 128, "per_head")],
    ids=["qwen", "llama"],
)
def test_decode_auto_variant(
    monkeypatch: pytest.MonkeyPatch, num_heads: int, num_kv_heads: int, head_dim: int, expected: str
) -> None:
    """variant=None runs the kernel choose_variant names, and gets the reference's result."""
    calls = _recording_launchers(monkeypatch)
    _run([19, 3], 16, num_heads, num_kv_heads, head_dim, torch.float32, None, "auto")
    assert calls == [expected]
    calls.clear()
    _run([19, 3], 16, num_heads, num_kv_heads, head_dim, torch.float32, None, "auto", "per_head")
    assert calls == ["per_head"]


def test_decode_unknown_variant_raises() -> None:
    gen = generator("decode-bad-variant")
    cache = make_paged_cache([5], 16, 2, 16, torch.float32, gen)
    q = randn((1, 4, 16), torch.float32, gen)
    with pytest.raises(ValueError, match="variant"):
        paged_decode_attention(
            q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.25, variant="all-heads"
        )
    with pytest.raises(ValueError, match="variant"):
        choose_num_splits(1, 2, 4096, q.device, variant="split_k")


def test_decode_non_contiguous_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache whose kv heads are not adjacent (head stride > D): auto falls back to per_head (and matches
    the reference); an explicit all_heads is refused."""
    gen = generator("decode-head-stride")
    wide = make_paged_cache([21, 6], 4, 2, 64, torch.float32, gen)
    k_cache, v_cache = wide.k_cache[..., :32], wide.v_cache[..., :32]
    assert k_cache.stride(2) == 64
    q = randn((2, 4, 32), torch.float32, gen)
    calls = _recording_launchers(monkeypatch)
    out = paged_decode_attention(q, k_cache, v_cache, wide.block_tables, wide.seq_lens, 0.3, num_splits=2)
    assert calls == ["per_head"]
    ref = paged_decode_attention_ref(q, k_cache, v_cache, wide.block_tables, wide.seq_lens, 0.3)
    assert_close(out, ref, torch.float32)
    with pytest.raises(ValueError, match="contiguous"):
        paged_decode_attention(
            q, k_cache, v_cache, wide.block_tables, wide.seq_lens, 0.3, variant="all_heads"
        )


def test_choose_num_splits() -> None:
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    assert choose_num_splits(4096, 8, 4096, dev) == 1  # the batch alone fills the GPU
    assert choose_num_splits(1, 1, 100, dev) == 1  # too short to split
    few = choose_num_splits(1, 2, 32768, dev)
    assert few > 1
    assert choose_num_splits(1, 2, 32768, dev) >= choose_num_splits(8, 2, 32768, dev)


def test_choose_num_splits_all_heads() -> None:
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    target = PROGRAMS_PER_SM * num_sms(dev)
    assert choose_num_splits_all_heads(4096, 4096, dev) == 1  # the batch alone fills the GPU
    assert choose_num_splits_all_heads(1, 100, dev) == 1  # too short to split
    assert choose_num_splits_all_heads(1, 600, dev) <= 3  # at least MIN_KEYS_PER_SPLIT keys per split
    # One program per sequence and split: enough splits to fill the GPU, up to MAX_SPLITS.
    assert choose_num_splits_all_heads(2, 1 << 20, dev) == min(MAX_SPLITS, -(-target // 2))
    # One program per (sequence, split) instead of one per (sequence, kv head, split): never fewer splits.
    for batch in (1, 2, 8, 64):
        assert choose_num_splits_all_heads(batch, 32768, dev) >= choose_num_splits(batch, 2, 32768, dev)


def test_choose_num_splits_follows_the_variant() -> None:
    """Given the head shapes, choose_num_splits counts for the variant paged_decode_attention picks."""
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    for batch, ctx in ((1, 32768), (2, 4096), (64, 1024), (3, 100)):
        qwen = choose_num_splits(batch, 2, ctx, dev, num_q_heads=14, head_dim=64)
        assert qwen == choose_num_splits_all_heads(batch, ctx, dev)
        assert qwen == choose_num_splits(batch, 2, ctx, dev, variant="all_heads")
        llama = choose_num_splits(batch, 8, ctx, dev, num_q_heads=32, head_dim=128)
        assert llama == choose_num_splits(batch, 8, ctx, dev)  # per_head, as without head shapes
        assert llama == choose_num_splits(batch, 8, ctx, dev, variant="per_head")
    # With one sequence (CPU stand-in: 4 SMs) the per-head count has 2 programs per split to fill with.
    assert choose_num_splits(1, 2, 1 << 20, dev, num_q_heads=14, head_dim=64) >= choose_num_splits(
        1, 2, 1 << 20, dev
    )


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
        _run(lens, block_size, num_heads, num_kv_heads, head_dim, dtype, splits, f"gpu{splits}")
        # Each variant explicitly too (all_heads only at the narrow shapes it is for).
        variants = (
            VARIANTS if choose_variant(num_heads, num_kv_heads, head_dim) == "all_heads" else ("per_head",)
        )
        for variant in variants:
            _run(lens, block_size, num_heads, num_kv_heads, head_dim, dtype, splits, f"gpu{splits}", variant)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"),
    [(14, 2, 64), (16, 2, 128), (8, 1, 128), (4, 4, 64), (12, 3, 64), (64, 2, 128), (7, 1, 64)],
    ids=["qwen0.5b", "w256", "mqa", "mha", "kv3", "rows64", "gqa7"],
)
@pytest.mark.parametrize("block_size", [16, 64, 128, 1, 4])
def test_decode_gpu_all_heads(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    """The all-heads variant's compiled tiles (BLOCK_N 32..128) at every shape it is chosen for."""
    assert choose_variant(num_heads, num_kv_heads, head_dim) == "all_heads"
    gen = generator("decode-gpu-all-heads", dtype, num_heads, num_kv_heads, head_dim, block_size)
    lens = torch.randint(1, 3000, (30,), generator=gen).tolist()
    lens += [0, 1, block_size, block_size + 1, 63, 64, 65, 4096]
    for splits in (None, 1, 2, 7, 64):
        _run(
            lens, block_size, num_heads, num_kv_heads, head_dim, dtype, splits, f"gpu-ah{splits}", "all_heads"
        )


@pytest.mark.gpu
def test_decode_gpu_few_long_sequences_split() -> None:
    """Two 32k-token sequences: the automatic split count must be > 1 and match the reference."""
    lens = [32768, 30001]
    assert choose_num_splits(2, 8, 32768, DEVICE) > 1
    _run(lens, 16, 32, 8, 128, torch.bfloat16, None, "long")
