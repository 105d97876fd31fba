"""paged_prefill_attention against the plain-torch reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

import numpy as np  # noqa: E402

from roseinfer.kernels.paged_decode_split import live_counters  # noqa: E402
from roseinfer.kernels.paged_prefill_attention import (  # noqa: E402
    paged_prefill_attention,
    paged_prefill_attention_ref,
)
from roseinfer.kernels.prefill_plan import (  # noqa: E402
    TILE_ROWS,
    KeySplit,
    key_split_for,
    partial_rows,
    prefill_tile_map,
)
from tests.kernels.kernel_utils import (  # noqa: E402
    DEVICE,
    DTYPE_IDS,
    FP8_DTYPES,
    assert_close,
    generator,
    head_major_copy,
    make_paged_cache,
    randn,
)


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
    cache_dtype: torch.dtype | None = None,
    q_beyond_fp16: bool = False,
) -> None:
    """`cache_dtype`: the KV cache's element type where it is not `dtype` (fp8). `q_beyond_fp16`: some query
    elements at +-1e5, which the kernel clamps to fp16's range where its dots run in fp16 (so does the reference)."""
    gen = generator(
        "prefill", seed_tag, q_lens, prefix_lens, block_size, num_heads, num_kv_heads, head_dim, dtype,
        cache_dtype,
    )  # fmt: skip
    seq_lens = [p + n for p, n in zip(q_lens, prefix_lens, strict=True)]
    cache = make_paged_cache(seq_lens, block_size, num_kv_heads, head_dim, cache_dtype or dtype, gen)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    num_tokens = starts[-1] + pad_rows
    query_start_loc = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    q = randn((num_tokens, num_heads, head_dim), dtype, gen)
    if q_beyond_fp16:
        q[::3, :, 0], q[1::3, :, 1] = 1e5, -1e5
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
    ref = paged_prefill_attention_ref(q.clamp(-65504, 65504) if q_beyond_fp16 else q, *args)
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


def test_prefill_non_pow2_head_dim_reads_no_lane_past_the_head() -> None:
    """A tile whose last key is the sequence's last (16 keys, one 16-key tile seen whole) in a 64-slot block:
    the slot after it is NaN, so an unmasked load of the padded lanes 80..127 (the next slot's first lanes)
    turns the scores NaN, though q's padded lanes are 0."""
    _run([1, 3], [15, 45], 64, 4, 2, 80, torch.float32, "hd80-edge")
    _run([1, 3], [15, 45], 64, 2, 1, 80, torch.float16, "hd80-edge")


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


def test_prefill_v_cache_of_another_layout() -> None:
    """k and v are read through their own strides: nothing but the same shape ties the two caches."""
    gen = generator("prefill-v-layout")
    cache = make_paged_cache([20, 37], 16, 2, 32, torch.float32, gen)
    q = randn((9, 4, 32), torch.float32, gen)
    qsl = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE)
    tail = (cache.block_tables, qsl, cache.seq_lens, 5, 32**-0.5)
    got = paged_prefill_attention(q, cache.k_cache, head_major_copy(cache.v_cache), *tail)
    assert_close(got, paged_prefill_attention_ref(q, cache.k_cache, cache.v_cache, *tail), torch.float32)


def test_prefill_strided_query() -> None:
    gen = generator("prefill-strided")
    cache = make_paged_cache([20], 16, 1, 32, torch.float16, gen)
    qkv = randn((6, (2 + 2) * 32), torch.float16, gen)
    q = qkv[:, : 2 * 32].view(6, 2, 32)
    qsl = torch.tensor([0, 6], dtype=torch.int32, device=DEVICE)
    args = (cache.k_cache, cache.v_cache, cache.block_tables, qsl, cache.seq_lens, 6, 32**-0.5)
    assert_close(paged_prefill_attention(q, *args), paged_prefill_attention_ref(q, *args), torch.float16)


def _run_tile_map(
    q_lens: list[int],
    prefix_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    block_m: int,
    first_seq: int,
    spare: int,
    block_size: int = 16,
    pad_rows: int = 0,
    split: KeySplit | None = None,
    eager: bool = False,
) -> np.ndarray:
    """The tile-map launch (a CUDA graph's fixed grid, `spare` idle programs) against the reference, for
    sequences first_seq.. (the earlier ones are decodes, left to the decode kernel). With `split`, the map
    may cut tiles' keys across programs; `eager`: partial rows only where it does, as an eager step launches
    it. Returns the tile map."""
    gen = generator("prefill-tiles", q_lens, prefix_lens, num_heads, num_kv_heads, head_dim, dtype, block_m)
    seq_lens = [p + n for p, n in zip(q_lens, prefix_lens, strict=True)]
    cache = make_paged_cache(seq_lens, block_size, num_kv_heads, head_dim, dtype, gen)
    starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    needed = sum(-(-n // block_m) for n in q_lens[first_seq:])
    capacity = needed + spare
    host_tiles = prefill_tile_map(starts, np.array(seq_lens), first_seq, block_m, capacity, split)
    used = int((host_tiles[0] >= 0).sum())
    assert (host_tiles[:, used:] == -1).all() and (host_tiles[:, :used] >= 0).all()
    assert used == needed if split is None else used >= needed
    tiles = torch.from_numpy(host_tiles).to(DEVICE)
    qsl = torch.from_numpy(starts).to(DEVICE)
    q = randn((int(starts[-1]) + pad_rows, num_heads, head_dim), dtype, gen)
    args = (
        cache.k_cache,
        cache.v_cache,
        cache.block_tables,
        qsl,
        cache.seq_lens,
        max(q_lens),
        head_dim**-0.5,
    )
    out = torch.full_like(q, float("nan"))
    # max_query_len and first_seq are deliberately wrong: a tile-map launch must not read them.
    split_rows = 0 if split is None else partial_rows(host_tiles) if eager else split.max_rows
    # Key splits write partials that must not reach the output: leave them garbage (NaN) before the launch.
    paged_prefill_attention(
        q, *args[:5], 1, args[6], out=out, block_m=block_m, tiles=tiles, split_rows=split_rows
    )
    ref = paged_prefill_attention_ref(q, *args)
    begin, end = int(starts[first_seq]), int(starts[-1])
    assert torch.isnan(out[:begin]).all(), "rows of sequences before first_seq were written"
    assert torch.isnan(out[end:]).all(), "rows outside every sequence were written"
    if begin < end:
        assert_close(out[begin:end], ref[begin:end], dtype)
    if split is not None:
        counters = live_counters(DEVICE)
        assert counters is None or int(counters.count_nonzero()) == 0, "a merge ticket was left taken"
    return host_tiles


@pytest.mark.parametrize(
    ("q_lens", "prefix_lens", "first_seq"),
    [
        ([1, 1, 33, 16, 5], [15, 16, 0, 17, 40], 2),  # decodes first, then chunks at and past tile edges
        ([17, 1, 9], [0, 31, 64], 0),  # one-token chunk among prefills
        ([1, 1], [3, 20], 2),  # decodes only: every program spare
    ],
    ids=["mixed", "prefills", "decodes-only"],
)
@pytest.mark.parametrize("block_m", [16, 32])
def test_prefill_tile_map_matches_reference(q_lens, prefix_lens, first_seq, block_m) -> None:
    _run_tile_map(q_lens, prefix_lens, 4, 2, 32, torch.float32, block_m, first_seq, spare=3, pad_rows=2)


def test_prefill_tile_map_orders_tiles_and_checks_its_capacity() -> None:
    starts = np.array([0, 1, 41, 46], np.int32)  # q_lens 1 (a decode), 40, 5
    seq_lens = np.array([10, 40, 105], np.int32)  # prefixes 9, 0, 100
    tiles = prefill_tile_map(starts, seq_lens, 1, 16, 6)
    # Keys each tile reads: seq 2 ends at 105; seq 1's tiles at 40, 32, 16; one spare program. No splits.
    assert tiles[:2].tolist() == [[2, 1, 1, 1, -1, -1], [0, 2, 1, 0, -1, -1]]
    assert tiles[2:, :4].tolist() == [[0] * 4, [1] * 4, [0] * 4]
    with pytest.raises(ValueError, match="exceed"):
        prefill_tile_map(starts, seq_lens, 1, 16, 3)
    q = torch.zeros((46, 2, 32))
    with pytest.raises(ValueError, match="block_m"):
        paged_prefill_attention(
            q,
            q.new_zeros(1, 16, 1, 32),
            q.new_zeros(1, 16, 1, 32),
            torch.zeros(3, 7, dtype=torch.int32),
            torch.from_numpy(starts),
            torch.from_numpy(seq_lens),
            40,
            1.0,
            tiles=torch.from_numpy(tiles),
        )


def test_prefill_tile_map_splits_long_tiles_within_its_limits() -> None:
    starts = np.array([0, 1, 41, 46], np.int32)  # q_lens 1 (a decode), 40, 5
    seq_lens = np.array([10, 40, 105], np.int32)  # prefixes 9, 0, 100: tiles of 16, 32, 40 and 105 keys
    split = KeySplit(num_heads=2, block_n=16, wave=32, min_keys=16, max_rows=64)
    tiles = prefill_tile_map(starts, seq_lens, 1, 16, 16, split)
    seq, block, piece, splits, first_row = tiles[:, : int((tiles[0] >= 0).sum())]
    # One program per key tile would take 91 partial rows (> 64), so each program takes two key tiles: seq
    # 2's tile (7 key tiles) in 4, seq 1's last tile (3) in 2. Longest programs first.
    assert list(zip(seq, block, piece, splits, first_row, strict=True)) == [
        (1, 1, 0, 1, 0),
        (2, 0, 0, 4, 16),
        (2, 0, 1, 4, 16),
        (2, 0, 2, 4, 16),
        (2, 0, 3, 4, 16),
        (1, 2, 0, 2, 0),
        (1, 2, 1, 2, 0),
        (1, 0, 0, 1, 0),
    ]
    # The partials' rows: seq 1's last tile 2 x 8 rows from 0, seq 2's tile 4 x 5 rows from 16.
    assert (tiles[:, 8:] == -1).all()
    # Enough programs already, or keys too few to split: one program a tile.
    many = KeySplit(num_heads=64, block_n=16, wave=32, min_keys=16)
    assert (prefill_tile_map(starts, seq_lens, 1, 16, 16, many)[3, :4] == 1).all()
    short = KeySplit(num_heads=2, block_n=16, wave=32, min_keys=256)
    assert (prefill_tile_map(starts, seq_lens, 1, 16, 16, short)[3, :4] == 1).all()
    # The capacity bounds the splits too: 6 entries for 4 tiles.
    capped = prefill_tile_map(starts, seq_lens, 1, 16, 6, split)
    assert (capped[0] >= 0).sum() <= 6 and (capped[3] > 1).any()


# (q_lens, prefix_lens, first_seq): short chunks over long prefixes (the case splits serve), beside decodes
# and a fresh prompt; lengths off block and tile boundaries; a chunk whose last share holds only diagonal
# tiles, so some rows of a share see no key.
SPLIT_CASES = {
    "chunks-over-prefixes": ([1, 1, 7, 33, 20], [40, 17, 150, 95, 0], 2),
    "one-short-chunk": ([5], [201], 0),
    "diagonal-shares": ([48, 3], [0, 64], 0),
}


@pytest.mark.parametrize("case", list(SPLIT_CASES))
@pytest.mark.parametrize("block_m", [16, 32])
def test_prefill_key_splits_match_reference(case: str, block_m: int) -> None:
    q_lens, prefix_lens, first_seq = SPLIT_CASES[case]
    split = KeySplit(num_heads=4, block_n=16, wave=64, min_keys=16, max_rows=256)
    tiles = _run_tile_map(
        q_lens, prefix_lens, 4, 2, 32, torch.float32, block_m, first_seq, spare=40, pad_rows=2, split=split
    )
    assert (tiles[3] > 1).any(), "the case cut no tile's keys: it tests nothing"


@pytest.mark.parametrize("num_splits", [2, 3, 5])
def test_prefill_key_splits_of_any_count_match_reference(num_splits: int) -> None:
    """Shares fixed by hand, more than some tiles have key tiles: empty shares and shares of diagonal tiles
    only must merge to the same output."""
    q_lens, prefix_lens = [3, 40, 9], [30, 0, 64]
    gen = generator("prefill-split-count", num_splits)
    seq_lens = [p + n for p, n in zip(q_lens, prefix_lens, strict=True)]
    cache = make_paged_cache(seq_lens, 16, 2, 32, torch.float32, gen)
    starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    base = prefill_tile_map(starts, np.array(seq_lens), 0, 16, 5)[:, :5]  # 5 tiles, one program each
    rows = np.minimum(16, np.array(q_lens)[base[0]] - base[1] * 16)
    first_row = np.cumsum(rows * num_splits) - rows * num_splits
    tiles = np.full((TILE_ROWS, 5 * num_splits + 3), -1, np.int32)
    for t in range(5):
        for p in range(num_splits):
            tiles[:, t * num_splits + p] = (base[0, t], base[1, t], p, num_splits, first_row[t])
    q = randn((int(starts[-1]), 4, 32), torch.float32, gen)
    args = (
        cache.k_cache,
        cache.v_cache,
        cache.block_tables,
        torch.from_numpy(starts).to(DEVICE),
        cache.seq_lens,
    )
    out = torch.full_like(q, float("nan"))
    paged_prefill_attention(
        q, *args, 1, 32**-0.5, out=out, block_m=16, tiles=torch.from_numpy(tiles).to(DEVICE), split_rows=512
    )
    ref = paged_prefill_attention_ref(q, *args, max(q_lens), 32**-0.5)
    assert_close(out, ref, torch.float32)
    assert int(live_counters(DEVICE).count_nonzero()) == 0


# ---------------------------------------------------------------- GPU (compiled) at real sizes


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("case", list(CASES))
def test_prefill_fp8_cache(cache_dtype: torch.dtype, dtype: torch.dtype, case: str) -> None:
    """An fp8 cache is read back widened to the queries' dtype: the reference's attention over the same
    (rounded) keys and values, across block and tile boundaries."""
    q_lens, prefix_lens = CASES[case]
    _run(q_lens, prefix_lens, 16, 4, 2, 64, dtype, "fp8", cache_dtype=cache_dtype)


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=DTYPE_IDS.get)
def test_prefill_fp8_cache_clamps_bf16_queries_to_fp16(cache_dtype: torch.dtype) -> None:
    """bf16 queries over an fp8 cache meet K/V in fp16 dots: elements past fp16's range are clamped, not inf."""
    lens, prefixes = [20, 3, 17], [0, 47, 16]
    _run(lens, prefixes, 16, 4, 2, 64, torch.bfloat16, "fp8big", cache_dtype=cache_dtype, q_beyond_fp16=True)


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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_m"),
    [(14, 2, 64, 64), (32, 8, 128, 128), (16, 16, 128, 32)],
    ids=["qwen0.5b", "llama8b", "mha-m32"],
)
@pytest.mark.parametrize("key_split", [False, True], ids=["tiles", "key-splits"])
def test_prefill_tile_map_gpu(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_m: int, key_split: bool
):
    q_lens = [1] * 37 + [191, 64, 1, 129, 3, 100, 17]
    prefix_lens = list(range(100, 137)) + [0, 1024, 5, 300, 2000, 900, 3001]
    split = None
    if key_split:  # few enough q tiles to leave most of a wave free: the engine's policy cuts their keys
        q_lens, prefix_lens = q_lens[:37] + [3, 100, 17], prefix_lens[:37] + [2000, 900, 3001]
        split = key_split_for(num_heads, head_dim, dtype, DEVICE)
    tiles = _run_tile_map(
        q_lens, prefix_lens, num_heads, num_kv_heads, head_dim, dtype, block_m, 37, spare=40, pad_rows=7,
        split=split,
    )  # fmt: skip
    assert not key_split or (tiles[3] > 1).any(), "no tile's keys were cut"


@pytest.mark.gpu
def test_prefill_tile_map_longer_than_a_grid_axis_gpu():
    """A map of more than 65,535 entries (CUDA's cap on a second grid axis) launches and computes every tile."""
    tiles = _run_tile_map(
        [1, 1, 70, 3, 129], [10, 20, 0, 500, 33], 14, 2, 64, torch.bfloat16, 16, 2, spare=70_000, pad_rows=3
    )
    assert tiles.shape[1] > 65_535


@pytest.mark.gpu
@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(14, 2, 64), (32, 8, 128)], ids=["qwen0.5b", "llama8b"]
)
def test_prefill_fp8_cache_gpu(
    cache_dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    q_lens, prefix_lens = [1000, 1, 333, 64, 2048], [0, 900, 17, 2000, 0]
    _run(
        q_lens,
        prefix_lens,
        16,
        num_heads,
        num_kv_heads,
        head_dim,
        torch.bfloat16,
        "fp8gpu",
        cache_dtype=cache_dtype,
    )
