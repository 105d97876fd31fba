"""`kernels/prefill_plan.py` on the host: the q tile height, the tile map (its tiles, key splits, partial rows
and order) and the planner's eager maps, against references written here with plain loops, over random
lengths at and off tile boundaries. No kernel runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roseinfer.kernels import prefill_plan
from roseinfer.kernels.prefill_plan import (
    GRAPH_LONG_FILL,
    GRAPH_LONG_MIN_TOKENS,
    LONG_CHUNK_TOKENS,
    LONG_PREFIX_RATIO,
    LONG_TILE,
    LONG_TILE_WAVES,
    MAX_KEY_SPLITS,
    PREFIX_CHUNK_TOKENS,
    SPLIT_PARTIAL_ROWS,
    TILE_ROWS,
    KeySplit,
    TilePlanner,
    key_split_for,
    leading_decodes,
    partial_rows,
    prefill_block_m,
    prefill_config,
    prefill_tile_map,
)

CPU = torch.device("cpu")


def _ceil(a: int, b: int) -> int:
    return (a + b - 1) // b


def _block_m_ref(cap: int, max_query_len: int) -> int:
    """The smallest power of two at least 16 that holds `max_query_len` rows, but no more than `cap`."""
    m = 16
    while m < max_query_len and m < cap:
        m *= 2
    return min(m, cap) if cap >= 16 else 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_block_m_is_the_smallest_tile_that_holds_the_chunk(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(11)
    lens = [0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 4096, *rng.integers(1, 3000, 40)]
    for head_dim in (8, 32, 64, 80, 128):
        cfg = prefill_config(max(16, 1 << (head_dim - 1).bit_length()), dtype)[0]
        for n in lens:
            assert prefill_block_m(head_dim, dtype, int(n)) == _block_m_ref(cfg, int(n)), (head_dim, n)
            for cap in (16, 32, 64, 128):
                assert prefill_block_m(head_dim, dtype, int(n), cap) == _block_m_ref(cap, int(n)), (n, cap)


def _split_counts_ref(keys: list[int], rows: list[int], split: KeySplit, capacity: int) -> list[int]:
    """The documented split policy, tile by tile: no splits when the tiles fill a wave; otherwise the fewest
    key tiles a program (at least the work spread over a wave, and `min_keys`), grown by an eighth until the
    programs fit one wave, the map and the partial rows; at most MAX_KEY_SPLITS and one a key tile."""
    if len(keys) * split.num_heads >= split.wave:
        return [1] * len(keys)
    key_tiles = [_ceil(k, split.block_n) for k in keys]
    per_program = max(
        _ceil(sum(key_tiles) * split.num_heads, split.wave), _ceil(split.min_keys, split.block_n), 1
    )
    while True:
        counts = [max(1, min(_ceil(kt, per_program), max(kt, 1), MAX_KEY_SPLITS)) for kt in key_tiles]
        part = sum(r * c for r, c in zip(rows, counts, strict=True) if c > 1)
        if sum(counts) * split.num_heads <= split.wave and sum(counts) <= capacity and part <= split.max_rows:
            return counts
        per_program += max(1, per_program // 8)


def _tile_map_ref(
    q_lens: list[int],
    seq_lens: list[int],
    first_seq: int,
    block_m: int,
    capacity: int,
    split: KeySplit | None,
) -> np.ndarray:
    """Every q tile of sequences first_seq.. (in order), cut into its splits, each split tile's partials
    after the previous split tiles'; sorted by keys a program, longest first, ties in tile order. (An unsplit
    tile's partial row is never read: `_same_map` leaves it out.)"""
    tiles = []  # (seq, block, keys, rows)
    for s in range(first_seq, len(q_lens)):
        q, prefix = q_lens[s], seq_lens[s] - q_lens[s]
        for b in range(_ceil(q, block_m)):
            tiles.append((s, b, prefix + min((b + 1) * block_m, q), min(block_m, q - b * block_m)))
    if split is None:
        counts = [1] * len(tiles)
    else:
        counts = _split_counts_ref([t[2] for t in tiles], [t[3] for t in tiles], split, capacity)
    entries, next_row = [], 0
    for (s, b, keys, rows), c in zip(tiles, counts, strict=True):
        entries += [((s, b, p, c, next_row), keys / c) for p in range(c)]
        next_row += rows * c if c > 1 else 0
    entries.sort(key=lambda e: -e[1])  # stable
    out = np.full((TILE_ROWS, capacity), -1, np.int32)
    for i, (entry, _) in enumerate(entries):
        out[:, i] = entry
    return out


def _same_map(got: np.ndarray, want: np.ndarray) -> bool:
    split = want[3] > 1
    return np.array_equal(got[:4], want[:4]) and np.array_equal(got[4][split], want[4][split])


def _random_step(rng: np.random.Generator, block_m: int) -> tuple[list[int], list[int], int]:
    n = int(rng.integers(1, 7))
    edges = [1, block_m - 1, block_m, block_m + 1, 2 * block_m + 1]
    q_lens = [int(rng.choice(edges)) if rng.random() < 0.5 else int(rng.integers(1, 200)) for _ in range(n)]
    prefixes = [
        int(rng.choice([0, 1, 15, 16, 255, 256, 257])) if rng.random() < 0.3 else int(rng.integers(0, 3000))
        for _ in range(n)
    ]
    first_seq = int(rng.integers(0, n + 1)) if rng.random() < 0.7 else 0
    return q_lens, [p + q for p, q in zip(prefixes, q_lens, strict=True)], first_seq


def _check_map(
    tiles: np.ndarray,
    q_lens: list[int],
    seq_lens: list[int],
    first_seq: int,
    block_m: int,
    split: KeySplit | None,
) -> None:
    """What the kernel needs whatever the policy: every q tile of first_seq.. once per split, pieces 0..n-1,
    no share without a key tile, partials of split tiles in disjoint runs below `max_rows`, -1 pads."""
    used = int((tiles[0] >= 0).sum())
    assert (tiles[:, :used] >= 0).all() and (tiles[:, used:] == -1).all()
    seen: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for s, b, p, c, r in tiles[:, :used].T.tolist():
        seen.setdefault((s, b), []).append((p, c, r))
    want = {(s, b) for s in range(first_seq, len(q_lens)) for b in range(_ceil(q_lens[s], block_m))}
    assert set(seen) == want
    runs = []
    for (s, b), got in seen.items():
        c, r = got[0][1], got[0][2]
        assert sorted(got) == [(p, c, r) for p in range(c)], (s, b, got)
        keys = seq_lens[s] - q_lens[s] + min((b + 1) * block_m, q_lens[s])
        if c > 1:
            assert split is not None and c <= min(MAX_KEY_SPLITS, _ceil(keys, split.block_n))
            runs.append((r, r + c * min(block_m, q_lens[s] - b * block_m)))
    runs.sort()
    assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:], strict=False)), runs
    if runs:
        assert split is not None and runs[0][0] >= 0 and runs[-1][1] <= split.max_rows
        assert used * split.num_heads <= split.wave


def test_prefill_tile_map_matches_its_reference_on_random_steps() -> None:
    rng = np.random.default_rng(2026)
    split_seen = 0
    for case in range(400):
        block_m = int(rng.choice([16, 32, 64]))
        q_lens, seq_lens, first_seq = _random_step(rng, block_m)
        q_tiles = sum(_ceil(q, block_m) for q in q_lens[first_seq:])
        capacity = q_tiles + int(rng.integers(0, 40))
        split = None
        if case % 5:
            split = KeySplit(
                num_heads=int(rng.choice([1, 2, 4, 8, 32])),
                block_n=int(rng.choice([16, 32, 64])),
                wave=int(rng.integers(4, 300)),
                min_keys=int(rng.choice([16, 64, 100, 256])),
                max_rows=int(rng.choice([16, 40, 64, 200, 2048])),
            )
        starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        got = prefill_tile_map(starts, np.array(seq_lens, np.int32), first_seq, block_m, capacity, split)
        assert got.shape == (TILE_ROWS, capacity) and got.dtype == np.int32
        _check_map(got, q_lens, seq_lens, first_seq, block_m, split)
        want = _tile_map_ref(q_lens, seq_lens, first_seq, block_m, capacity, split)
        assert _same_map(got, want), (q_lens, seq_lens, first_seq, block_m, capacity, split)
        split_seen += int((got[3] > 1).any())
        if q_tiles:
            with pytest.raises(ValueError, match="exceed"):
                prefill_tile_map(starts, np.array(seq_lens), first_seq, block_m, q_tiles - 1, split)
    assert split_seen > 50, "too few cases cut keys: the reference's split path went untested"


def test_leading_decodes_counts_the_one_token_sequences_in_front() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        q_lens = rng.choice([1, 1, 1, 2, 7, 0], size=int(rng.integers(1, 9)))
        want = 0
        while want < len(q_lens) and q_lens[want] == 1:
            want += 1
        assert leading_decodes(q_lens) == want, q_lens


@pytest.mark.parametrize("sms", [8, 13, 33])
def test_planner_eager_map_matches_its_reference(monkeypatch: pytest.MonkeyPatch, sms: int) -> None:
    """The planner's map for an eager step: the tiles after its leading decodes, room for a wave's worth of
    splits beyond them, and only when some tile's keys are cut (then trimmed to its programs)."""
    monkeypatch.setattr(prefill_plan, "num_sms", lambda device: sms)
    rng = np.random.default_rng(sms)
    planned_seen = 0
    for _ in range(200):
        num_heads = int(rng.choice([1, 2, 3, 6]))
        planner = TilePlanner(num_heads, 32, torch.float32, CPU)
        split = planner.split
        assert split is not None and split.wave == key_split_for(num_heads, 32, torch.float32, CPU).wave
        n = int(rng.integers(1, 6))
        decodes = int(rng.integers(0, n + 1))
        q_lens = [1] * decodes + [int(rng.integers(1, 90)) for _ in range(n - decodes)]
        seq_lens = [q + int(rng.choice([0, 40, 600, 3000, 9000])) for q in q_lens]
        starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int64)
        got = planner.eager_map(starts, np.array(seq_lens))
        first = leading_decodes(np.array(q_lens))
        if first == n:
            assert got is None
            continue
        block_m = prefill_block_m(32, torch.float32, max(q_lens[first:]))
        q_tiles = sum(_ceil(q, block_m) for q in q_lens[first:])
        want = _tile_map_ref(q_lens, seq_lens, first, block_m, q_tiles + _ceil(split.wave, num_heads), split)
        if not (want[3] > 1).any():
            assert got is None, (q_lens, seq_lens)
            continue
        planned_seen += 1
        assert got is not None
        tiles, got_block_m = got
        assert got_block_m == block_m and tiles.flags.c_contiguous
        assert _same_map(tiles, want[:, : int((want[0] >= 0).sum())]), (q_lens, seq_lens)
    assert planned_seen > 10


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_key_split_matches_the_compiled_tile(monkeypatch: pytest.MonkeyPatch, head_dim: int, dtype) -> None:
    """The engine's split policy on a GPU: key tiles as long as the kernel's, and a wave of one 8-warp
    program or two smaller ones an SM."""
    monkeypatch.setattr(prefill_plan, "is_interpret", lambda: False)
    monkeypatch.setattr(prefill_plan, "num_sms", lambda device: 132)
    split = key_split_for(40, head_dim, dtype, CPU)
    _, block_n, num_warps, _ = prefill_config(head_dim, dtype)
    assert (split.num_heads, split.block_n) == (40, block_n)
    assert split.wave == 132 * (1 if num_warps == 8 else 2)


def test_the_long_tile_is_configured_where_it_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, a 128-row tile at D=128 over a half-precision cache launches as LONG_TILE; other tiles, head
    sizes and fp8 caches keep their configs, and the default tile height stays the 64-row one."""
    monkeypatch.setattr(prefill_plan, "is_interpret", lambda: False)
    assert prefill_config(128, torch.bfloat16, torch.bfloat16, 128) == LONG_TILE
    assert prefill_config(128, torch.float16, None, 256) == LONG_TILE
    assert prefill_config(128, torch.bfloat16, torch.bfloat16, 64) == prefill_config(128, torch.bfloat16)
    assert prefill_config(128, torch.bfloat16, torch.float8_e5m2, 128) == (64, 64, 4, 3)
    assert prefill_config(64, torch.bfloat16, None, 128) == prefill_config(64, torch.bfloat16)
    assert prefill_config(128, torch.float32, None, 128) == prefill_config(128, torch.float32)
    assert prefill_block_m(128, torch.bfloat16, 9000) == 64


def _long_planner(
    monkeypatch: pytest.MonkeyPatch, num_heads: int = 32, ws: bool = True, **kwargs
) -> TilePlanner:
    """A planner on a GPU of 132 SMs (an H100's), at llama-3.1-8b's heads unless told; `ws`: whether the
    warp-specialised kernel runs there (`paged_prefill_ws.runs_on`)."""
    monkeypatch.setattr(prefill_plan, "is_interpret", lambda: False)
    monkeypatch.setattr(prefill_plan, "num_sms", lambda device: 132)
    monkeypatch.setattr(prefill_plan.paged_prefill_ws, "runs_on", lambda *args: ws)
    kwargs.setdefault("block_size", 16)
    return TilePlanner(
        num_heads, kwargs.pop("head_dim", 128), kwargs.pop("dtype", torch.bfloat16), CPU, **kwargs
    )


def test_the_long_tile_pays_for_long_chunks_over_long_prefixes_or_many_waves(monkeypatch) -> None:
    """LONG_TILE for a chunk of PREFIX_CHUNK_TOKENS or more over LONG_PREFIX_RATIO times as many cached tokens
    (W7's 1015-token chunk beside nine decodes among them), or for a chunk of LONG_CHUNK_TOKENS or more in a
    step of LONG_TILE_WAVES waves of its programs (one an SM); not for a lone fresh 1024-token chunk, shorter
    chunks over any prefix, or where the tile does not apply (fp32, fp8 cache, D=64, no planner split)."""
    planner = _long_planner(monkeypatch)
    n, p = LONG_CHUNK_TOKENS, PREFIX_CHUNK_TOKENS
    assert p < n

    def pays(q_lens: list[int], prefixes: list[int], p: TilePlanner = planner) -> bool:
        return p.long_tile_pays(np.array(q_lens), np.array(prefixes))

    assert pays([n], [9216]) and pays([n], [4096]) and pays([n], [LONG_PREFIX_RATIO * n])
    assert pays([1] * 9 + [n - 9], [9216] * 10)  # decodes first, as the step sends them
    assert pays([p], [LONG_PREFIX_RATIO * p]) and not pays([p - 1], [100_000])
    assert not pays([p], [LONG_PREFIX_RATIO * p - 1]) and not pays([n - 1], [LONG_PREFIX_RATIO * (n - 1) - 1])
    assert pays([5, n + 1, 70], [0, LONG_PREFIX_RATIO * (n + 1), 3]) and pays([2048], [4096])
    assert not pays([n], [0]) and not pays([n], [LONG_PREFIX_RATIO * n - 1])
    assert not pays([n, 256], [0, 100_000])  # the long prefix is under a short chunk (and 10 tiles a head)
    assert pays([n, 512], [n, 0]) and not pays([n, 512], [n - 1, 0])
    # fresh 2048-token chunks: 16 q tiles each at 32 heads, 512 programs >= 3 waves of 132; 1024: 256, fewer
    waves = LONG_TILE_WAVES * 132
    assert pays([2048] * 4, [0] * 4) and pays([2048], [0]) and not pays([n], [0])
    assert not pays([n - 1] * 8, [0] * 8)  # waves count only beside a chunk of LONG_CHUNK_TOKENS
    q_tiles = -(-waves // 32)
    assert pays([n] + [128] * (q_tiles - 8), [0] * (q_tiles - 7))
    assert not pays([n] + [128] * (q_tiles - 9), [0] * (q_tiles - 8))
    for other in (
        _long_planner(monkeypatch, dtype=torch.float32),
        _long_planner(monkeypatch, cache_dtype=torch.float8_e4m3fn),
        _long_planner(monkeypatch, head_dim=64),
        _long_planner(monkeypatch, key_splits=False),
    ):
        assert not pays([n], [9216], other) and not pays([2048] * 8, [0] * 8, other)


def test_an_eager_step_in_the_long_tile_gets_its_map(monkeypatch: pytest.MonkeyPatch) -> None:
    """W7's chunk (1024 new tokens over 9216 cached, after decodes) at llama-3.1-8b's heads: the eager map is
    LONG_TILE's, its 8 q tiles a head more than a wave of one 8-warp program an SM, so no key is cut. A lone
    fresh chunk keeps the plain grid. At 8 heads the long chunk's tiles leave most of the wave free: its keys
    are cut, within LONG_TILE's wave."""
    planner = _long_planner(monkeypatch)
    assert planner.long_split == KeySplit(32, LONG_TILE[1], 132)
    assert planner.split_at(128) is planner.long_split and planner.split_at(64) is planner.split
    qsl, lens = np.array([0, 1, 2, 2 + 1024]), np.array([50, 700, 1024 + 9216])
    got = planner.eager_map(qsl, lens)
    assert got is not None and got[1] == LONG_TILE[0]
    tiles = got[0]
    assert tiles.shape[1] == 8 and (tiles[0] == 2).all() and (tiles[3] == 1).all()
    assert sorted(tiles[1]) == list(range(8))
    assert partial_rows(tiles) == 0  # no cut key: the launch needs no partials and no merge
    assert planner.eager_map(np.array([0, 1024]), np.array([1024])) is None
    few = _long_planner(monkeypatch, num_heads=8)
    got = few.eager_map(np.array([0, 1024]), np.array([1024 + 60_000]))
    assert got is not None and got[1] == LONG_TILE[0]
    assert (got[0][3] == 2).all() and got[0].shape[1] * 8 <= 132  # 16 programs a head: one wave
    assert partial_rows(got[0]) == SPLIT_PARTIAL_ROWS


def test_a_graph_takes_the_long_tile_for_full_tiles_over_long_prefixes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a mixed-step graph (whose 64-row map the caller has found to cut no key), LONG_TILE's uncut map for chunks
    each over at least LONG_PREFIX_RATIO times as many cached tokens, of GRAPH_LONG_MIN_TOKENS or more in all,
    whose 128-row tiles are GRAPH_LONG_FILL full; the cases the `--maps` sweep timed on both sides of the rule."""
    planner = _long_planner(monkeypatch)
    assert LONG_PREFIX_RATIO == 1 and GRAPH_LONG_FILL == 0.9 and GRAPH_LONG_MIN_TOKENS == 256

    def pays(q_lens: list[int], prefixes: list[int], p: TilePlanner = planner) -> bool:
        return p.graph_long_tile_pays(np.array(q_lens), np.array(prefixes))

    for q_lens, prefix in (([1024], 1024), ([768], 768), ([512], 4096), ([384], 4096), ([256] * 4, 1000)):
        assert pays(q_lens, [prefix] * len(q_lens)), (q_lens, prefix)
    assert pays([256, 256], [2048, 256]) and pays([500, 500], [500, 500])
    assert not pays([300] * 3, [700] * 3)  # 900 rows in 9 tiles of 128: 78% full
    assert pays([116] * 4, [4096] * 4) and not pays([115] * 4, [4096] * 4)  # 464 and 460 rows of 512
    assert not pays([700], [300]) and not pays([768], [767]) and not pays([512, 512], [512, 511])
    assert not pays([768], [0]) and not pays([128] * 8, [0] * 8)  # fresh chunks
    assert not pays([128], [4096]) and not pays([255], [4096]) and pays([256], [4096])  # the least work
    for other in (
        _long_planner(monkeypatch, dtype=torch.float32),
        _long_planner(monkeypatch, cache_dtype=torch.float8_e4m3fn),
        _long_planner(monkeypatch, head_dim=64),
        _long_planner(monkeypatch, key_splits=False),
        _long_planner(monkeypatch, block_size=None),  # no cache block size given: no WS kernel assumed
        _long_planner(monkeypatch, ws=False),
    ):
        assert not pays([1024], [1024], other)


def test_an_eager_step_takes_the_graph_rule_where_the_ws_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """An eager step (above the graphs' cap, or an eager engine) whose 64-row map cuts no key takes LONG_TILE's
    uncut map where `graph_long_tile_pays`: four 512-token follow-ups over 4096 cached, after two decodes, get 16
    q tiles of 128 rows, each one program with all its keys (so the WS kernel runs it), the longest first. Where
    the rule does not hold, or the WS kernel does not run, the step keeps what it had: the plain grid, or the
    64-row map that cuts keys. (LONG_TILE's own rule comes first: `test_an_eager_step_in_the_long_tile_gets_its_map`.)"""
    planner = _long_planner(monkeypatch)
    q_lens, seq_lens = [1, 1, 512, 512, 512, 500], [900, 40, 4608, 4608, 4608, 4600]
    qsl = np.concatenate([[0], np.cumsum(q_lens)])
    got = planner.eager_map(qsl, np.array(seq_lens))
    assert got is not None
    tiles, block_m = got
    assert block_m == LONG_TILE[0] and tiles.flags.c_contiguous
    want = _tile_map_ref(q_lens, seq_lens, 2, LONG_TILE[0], 16, None)
    assert tiles.shape == (TILE_ROWS, 16) and _same_map(tiles, want)
    assert (tiles[3] == 1).all() and partial_rows(tiles) == 0
    for other in (_long_planner(monkeypatch, ws=False), _long_planner(monkeypatch, block_size=None)):
        assert other.eager_map(qsl, np.array(seq_lens)) is None  # the plain 64-row grid
    for q_lens, prefix in (([300] * 3, 700), ([700], 300), ([768], 0)):  # the rule does not hold
        qsl, lens = np.concatenate([[0], np.cumsum(q_lens)]), np.array([q + prefix for q in q_lens])
        assert planner.eager_map(qsl, lens) is None, (q_lens, prefix)
    got = planner.eager_map(np.array([0, 256]), np.array([256 + 4096]))  # the 64-row map cuts keys: it stays
    assert got is not None and got[1] == 64 and partial_rows(got[0]) == SPLIT_PARTIAL_ROWS


def test_long_tiles_fill_a_wave_where_the_eager_map_cuts_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where `long_tiles_fill_a_wave` holds, LONG_TILE's eager map of the chunks cuts no key (a mixed-step graph's
    twin, which cuts none, runs it as fast): at 32 heads (one 8-warp program an SM, 132 SMs) from 5 q tiles of 128
    rows on, at 8 heads from 17. Over a long prefix, fewer tiles have their keys cut. `long_map_cuts_no_key` says
    which maps cut none, on either side."""
    cut_below = {32: 0, 16: 0, 8: 0, 4: 0}
    uncut_below = {32: 0, 16: 0, 8: 0, 4: 0}
    for heads in (32, 16, 8, 4):
        planner = _long_planner(monkeypatch, num_heads=heads)
        for q_len in range(128, 20 * 128 + 1, 64):
            q_lens = np.array([1, q_len])
            qsl, lens = np.concatenate([[0], np.cumsum(q_lens)]), np.array([900, q_len + 60_000])
            tiles = planner.tile_map(qsl, lens, 1, LONG_TILE[0], planner.capacity(-(-q_len // 128)))
            fills = planner.long_tiles_fill_a_wave(q_lens[1:])
            assert fills == (-(-q_len // 128) * heads >= 132), (heads, q_len)
            assert planner.long_map_cuts_no_key(qsl, lens, 1) == (tiles[3] <= 1).all(), (heads, q_len)
            if fills:
                assert (tiles[3] <= 1).all(), (heads, q_len)
            else:
                cut_below[heads] += bool((tiles[3] > 1).any())
                uncut_below[heads] += bool((tiles[3] <= 1).all())
    assert cut_below[32] > 0 and cut_below[16] > 0 and cut_below[8] > 0 and cut_below[4] > 0, cut_below
    assert uncut_below[16] > 0, uncut_below  # 8 tiles at 16 heads: 128 programs, no room to cut
