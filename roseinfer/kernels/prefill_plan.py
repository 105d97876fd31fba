"""Launch planning for paged prefill attention, on the host: the tile shape, and the tile map that gives a
CUDA graph's replay a grid fixed whatever the step holds and may cut long tiles' keys across programs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from roseinfer.kernels import paged_prefill_ws
from roseinfer.kernels._common import is_interpret, next_power_of_2, num_sms
from roseinfer.kv.cache_dtype import is_fp8

# A chunk of PREFIX_CHUNK_TOKENS or more over at least as many cached ones, or a chunk of LONG_CHUNK_TOKENS or
# more in a step of at least LONG_TILE_WAVES waves of its programs, takes the 128-row tile at D=128 over a
# half-precision cache: each key tile read serves twice the rows. Swept on an H200 at llama-3.1-8b's heads (us,
# 64-row tile -> LONG_TILE): 1 x 1024 over 9216 cached 538 -> 464, over 4096 274 -> 239, over 2048 166 -> 147,
# over 1024 113 -> 102; 1 x 1015 (W7's chunk beside nine decodes) over 9216 546 -> 473; 1 x 768 over 4096
# 256 -> 225, over 768 79 -> 74; 1 x 512 over 4096 136 -> 122, but over 512 38 -> 42. Fresh: 4 x 2048
# 483 -> 441, 1 x 2048 148 -> 136, 1 x 4096 465 -> 410. A lone fresh 1024-token chunk (two waves of unequal
# programs) keeps the 64-row tile: 56 -> 54, but 87 -> 170 when swept first on a cold GPU. Shorter fresh
# chunks lose (16 x 512 184 -> 194). On Hopper the launches that cut no key run the warp-specialised kernel
# (`paged_prefill_ws.py`), 1.15-1.39x faster than these 128 x 128 figures. This rule was not re-tuned for it; steps
# whose 64-row map cuts no key take a rule of their own for it (GRAPH_LONG_FILL below).
LONG_CHUNK_TOKENS = 1024
PREFIX_CHUNK_TOKENS = 768
LONG_PREFIX_RATIO = 1  # cached tokens before the chunk, per chunk token
LONG_TILE_WAVES = 3
LONG_TILE = (128, 128, 8, 2)
# Chunks whose 64-row map cuts no key take LONG_TILE's uncut map where the warp-specialised kernel runs it (in a
# mixed-step graph, the twin captured at it) when each has at least as many cached tokens before it and the
# 128-row tiles are at least GRAPH_LONG_FILL full. Timed in CUDA graphs on an H200 at llama-3.1-8b's heads (us,
# 64-row map -> LONG_TILE's; `sweep_prefill_tiles.py --maps`): 1 x 1024 over 1024 86 -> 70, 1 x 768 over 768
# 61 -> 48, 1 x 512 over 4096 118 -> 83, 1 x 384 over 4096 114 -> 77, 4 x 256 over 1000 74 -> 63, 2 x 256 over
# 2048 62 -> 50, 2 x 500 over 500 52 -> 50. It loses on part-empty tiles (3 x 300 over 700 56 -> 67), where the
# 64-row map cuts keys (1 x 256 over 4096 66 -> 76, 1 x 100 over 900 20 -> 24), over shorter prefixes (1 x 700
# over 300 37 -> 40) and on fresh chunks (1 x 768 26 -> 29, 8 x 128 18 -> 27).
GRAPH_LONG_FILL = 0.9
GRAPH_LONG_MIN_TOKENS = 256  # the fewest chunk tokens the rule takes: so the smallest graph with a twin


def long_tile_applies(head_dim_pad: int, dtype: torch.dtype, cache_dtype: torch.dtype | None = None) -> bool:
    """Whether a long chunk takes LONG_TILE: D=128, half-precision queries and cache, on a GPU."""
    half = dtype in (torch.float16, torch.bfloat16)
    return (
        not is_interpret() and head_dim_pad == 128 and half and (cache_dtype is None or cache_dtype == dtype)
    )


def prefill_config(
    head_dim_pad: int, dtype: torch.dtype, cache_dtype: torch.dtype | None = None, block_m: int | None = None
) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for queries of `dtype` over a cache of `cache_dtype` (default:
    `dtype`); `block_m` >= 128 asks for the long chunks' tile where it applies."""
    if is_interpret():
        return 16, 16, 4, 1
    if dtype == torch.float32:
        return 64, 32, 4, 2
    if (
        block_m is not None
        and block_m >= LONG_TILE[0]
        and long_tile_applies(head_dim_pad, dtype, cache_dtype)
    ):
        return LONG_TILE
    # Swept on an H100 (bf16, block size 16, scripts/sweep_prefill_tiles.py): at D=64, 233 TFLOP/s on 4 x 2k
    # fresh prompts. At D=128, 64 x 64 with 4 warps: 293 TFLOP/s on 4 x 2k (128 x 128 with 8 warps: 305) and
    # 191 on 16 x 512 (175). The 128 x 32 tile with 8 warps, the fastest in the ninth session, read 205 and 129
    # in the twenty-fourth.
    # Over an fp8 cache (fp16 dots) a third stage hides the widening at D=128: 4 x 2k 601 -> 532 us at llama's
    # heads, 16 x 512 195 -> 186 (bf16 cache: 470, 181). A bf16 cache's tiles lose with it.
    if head_dim_pad == 128 and cache_dtype is not None and is_fp8(cache_dtype):
        return 64, 64, 4, 3
    if head_dim_pad <= 128:
        return 64, 64, 4, 2
    return 64, 32, 8, 2


def prefill_block_m(head_dim: int, dtype: torch.dtype, max_query_len: int, block_m: int | None = None) -> int:
    """The q tile height for chunks of up to `max_query_len` tokens: short chunks (mixed batches of decodes
    and small prefills) would waste most of a big tile. (LONG_TILE is the planner's choice, from the step's
    lengths: `TilePlanner.long_tile_pays`.)"""
    d_pad = max(16, next_power_of_2(head_dim))
    block_m = block_m or prefill_config(d_pad, dtype)[0]
    return max(16, min(block_m, next_power_of_2(max(1, max_query_len))))


# A tile map's rows: the sequence, its q tile, the key split, the tile's split count, the tile's first partial
# row (key splits only).
TILE_ROWS = 5
MAX_KEY_SPLITS = 16
# A split shorter than this many keys does not pay for its partial's write and merge.
MIN_KEYS_PER_SPLIT = 256
# Rows of partials one launch's key splits may write ([rows, heads, head_dim] fp32: 32 MiB at llama-3.1-8b's
# heads): a 100-token chunk cut 16 ways takes 1,600.
SPLIT_PARTIAL_ROWS = 2048


@dataclass(frozen=True)
class KeySplit:
    """How a tile map may cut q tiles' keys across programs (flash-decoding for chunks). A short chunk over
    a long cached prefix otherwise makes a few programs a head, each walking every key in turn while most
    SMs idle."""

    num_heads: int
    block_n: int
    wave: int  # programs the GPU runs at once
    min_keys: int = MIN_KEYS_PER_SPLIT
    max_rows: int = SPLIT_PARTIAL_ROWS


def key_split_for(
    num_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, block_m: int | None = None
) -> KeySplit:
    """The engine's split policy for a model's heads, at the tile `block_m` picks (`prefill_config`). An SM
    holds one 8-warp program of the 128-row tile (230 registers a thread with the merge) and at least two of
    the 4-warp ones."""
    d_pad = max(16, next_power_of_2(head_dim))
    _, block_n, num_warps, _ = prefill_config(d_pad, dtype, block_m=block_m)
    per_sm = 1 if num_warps >= 8 else 2
    return KeySplit(num_heads, block_n, per_sm * num_sms(device))


def _split_counts(keys: np.ndarray, rows: np.ndarray, split: KeySplit, capacity: int) -> np.ndarray:
    """Splits per q tile: programs that each walk about the same number of key tiles, none shorter than
    `min_keys`, all in one wave (a second wave of programs costs more than the split saves), within the
    map's capacity and the partials' rows. No splits when the tiles alone fill a wave."""
    counts = np.ones(len(keys), np.int64)
    if len(keys) * split.num_heads >= split.wave:
        return counts
    key_tiles = -(-keys // split.block_n)
    work = int(key_tiles.sum()) * split.num_heads
    per_program = max(-(-work // split.wave), -(-split.min_keys // split.block_n), 1)
    most = np.minimum(np.maximum(key_tiles, 1), MAX_KEY_SPLITS)
    while True:
        counts = np.minimum(-(-key_tiles // per_program), most).clip(min=1)
        total = int(counts.sum())
        fits = total * split.num_heads <= split.wave and total <= capacity
        if fits and int((rows * counts)[counts > 1].sum()) <= split.max_rows:
            return counts
        per_program += max(1, per_program // 8)


def prefill_tile_map(
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    first_seq: int,
    block_m: int,
    capacity: int,
    split: KeySplit | None = None,
) -> np.ndarray:
    """[TILE_ROWS, capacity] int32: the (sequence, q tile, key split, splits, partial row) each program of a
    tile-map launch takes, for sequences `first_seq..`; the programs with the most keys first, so the launch
    ends on short ones; -1 pads. Without `split` every tile is one program."""
    q_lens = np.diff(query_start_loc.astype(np.int64))[first_seq:]
    counts = -(-q_lens // block_m)
    total = int(counts.sum())
    if total > capacity:
        raise ValueError(f"{total} q tiles exceed the tile map's {capacity}")
    seq = np.repeat(np.arange(first_seq, first_seq + len(q_lens)), counts)
    block = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    tile_q_lens = np.repeat(q_lens, counts)
    prefix = np.repeat(seq_lens[first_seq:].astype(np.int64) - q_lens, counts)
    keys = prefix + np.minimum((block + 1) * block_m, tile_q_lens)
    rows = np.minimum(block_m, tile_q_lens - block * block_m)
    splits = np.ones(total, np.int64)
    if split is not None:
        splits = _split_counts(keys, rows, split, capacity)
    # Each split tile's partials take `rows x splits` rows from its first partial row on.
    part_rows = np.where(splits > 1, rows * splits, 0)
    first_row = np.cumsum(part_rows) - part_rows
    tile = np.repeat(np.arange(total), splits)
    entries = len(tile)
    piece = np.arange(entries) - np.repeat(np.cumsum(splits) - splits, splits)
    order = np.argsort(-(keys / splits)[tile], kind="stable")
    tiles = np.full((TILE_ROWS, capacity), -1, np.int32)
    for row, values in enumerate((seq[tile], block[tile], piece, splits[tile], first_row[tile])):
        tiles[row, :entries] = values[order]
    return tiles


def q_tile_count(q_lens: np.ndarray, block_m: int) -> int:
    """The q tiles of `block_m` rows that chunks of `q_lens` tokens take."""
    return int((-(-q_lens // block_m)).sum())


def cuts_keys(tiles: np.ndarray) -> bool:
    """Whether a tile map cuts some tile's keys across programs."""
    return bool((tiles[3] > 1).any())


def partial_rows(tiles: np.ndarray) -> int:
    """The `split_rows` a map's launch takes: SPLIT_PARTIAL_ROWS where it cuts some tile's keys, else 0, which
    launches the kernel variant without the partials' writes and merge."""
    return SPLIT_PARTIAL_ROWS if cuts_keys(tiles) else 0


def leading_decodes(q_lens: np.ndarray) -> int:
    """How many sequences at the front have one new token (decode-first puts the decodes there)."""
    return len(q_lens) if (q_lens == 1).all() else int(np.argmax(q_lens != 1))


class TilePlanner:
    """A model's prefill tile maps on one device: the room key splits need, and the eager steps they pay on."""

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        key_splits: bool = True,
        cache_dtype: torch.dtype | None = None,
        block_size: int | None = None,
    ) -> None:
        self.head_dim = head_dim
        self.dtype = dtype
        self.split = key_split_for(num_heads, head_dim, dtype, device) if key_splits else None
        d_pad = max(16, next_power_of_2(head_dim))
        self.long_split = (  # the split policy of LONG_TILE's launches (its key tiles, its wave)
            key_split_for(num_heads, head_dim, dtype, device, LONG_TILE[0])
            if key_splits and long_tile_applies(d_pad, dtype, cache_dtype)
            else None
        )
        # Whether the warp-specialised kernel runs LONG_TILE's uncut maps here (the cache's `block_size` given).
        self.ws_long = (
            self.long_split is not None
            and block_size is not None
            and paged_prefill_ws.runs_on(device, dtype, cache_dtype or dtype, head_dim, block_size)
        )
        # Programs a map holds beyond one per q tile, for key splits: at most a wave's (the default tile's
        # wave is the widest).
        self.split_entries = -(-self.split.wave // num_heads) if self.split is not None else 0

    def capacity(self, q_tiles: int) -> int:
        return q_tiles + self.split_entries

    def long_tile_pays(self, q_lens: np.ndarray, prefix_lens: np.ndarray) -> bool:
        """Whether a step's prefill chunks (not its decodes) run faster in LONG_TILE (see PREFIX_CHUNK_TOKENS)."""
        if self.long_split is None:
            return False
        if ((q_lens >= PREFIX_CHUNK_TOKENS) & (prefix_lens >= LONG_PREFIX_RATIO * q_lens)).any():
            return True
        if not (q_lens >= LONG_CHUNK_TOKENS).any():
            return False
        programs = q_tile_count(q_lens, LONG_TILE[0]) * self.long_split.num_heads
        return programs >= LONG_TILE_WAVES * self.long_split.wave

    def graph_long_tile_pays(self, q_lens: np.ndarray, prefix_lens: np.ndarray) -> bool:
        """Whether prefill chunks whose 64-row map cuts no key run faster in LONG_TILE's uncut map, which the
        warp-specialised kernel runs (see GRAPH_LONG_FILL)."""
        if not self.ws_long or int(q_lens.sum()) < GRAPH_LONG_MIN_TOKENS:
            return False
        rows = q_tile_count(q_lens, LONG_TILE[0]) * LONG_TILE[0]
        over_prefixes = bool((prefix_lens >= LONG_PREFIX_RATIO * q_lens).all())
        return over_prefixes and int(q_lens.sum()) >= GRAPH_LONG_FILL * rows

    def long_tiles_fill_a_wave(self, q_lens: np.ndarray) -> bool:
        """Whether LONG_TILE's q tiles for these chunks fill a wave, so that its eager map would cut no key."""
        tiles = q_tile_count(q_lens, LONG_TILE[0])
        return self.long_split is not None and tiles * self.long_split.num_heads >= self.long_split.wave

    def long_map_cuts_no_key(self, query_start_loc: np.ndarray, seq_lens: np.ndarray, first_seq: int) -> bool:
        """Whether LONG_TILE's eager map of the chunks from `first_seq` on cuts no key (so a twin graph's map, which
        cuts none, is the same launch): where its q tiles fill a wave without building it, else as built."""
        chunks = np.diff(query_start_loc.astype(np.int64))[first_seq:]
        if self.long_tiles_fill_a_wave(chunks):
            return True
        q_tiles = q_tile_count(chunks, LONG_TILE[0])
        tiles = self.tile_map(query_start_loc, seq_lens, first_seq, LONG_TILE[0], self.capacity(q_tiles))
        return not cuts_keys(tiles)

    def split_at(self, block_m: int) -> KeySplit | None:
        """The split policy at the tile `block_m` launches with (its key tiles and its wave)."""
        return self.long_split if block_m >= LONG_TILE[0] and self.long_split is not None else self.split

    def tile_map(
        self, query_start_loc: np.ndarray, seq_lens: np.ndarray, first_seq: int, block_m: int, capacity: int
    ) -> np.ndarray:
        return prefill_tile_map(
            query_start_loc, seq_lens, first_seq, block_m, capacity, self.split_at(block_m)
        )

    def eager_map(self, query_start_loc: np.ndarray, seq_lens: np.ndarray) -> tuple[np.ndarray, int] | None:
        """(tile map, block_m) for an eager step that takes LONG_TILE (by either rule) or whose map cuts some
        tile's keys (its q tiles leave most of a wave free); None: the plain grid at the default tile serves it."""
        q_lens = np.diff(query_start_loc.astype(np.int64))
        first = leading_decodes(q_lens)
        if self.split is None or first == len(q_lens):
            return None
        chunks = q_lens[first:]
        prefixes = seq_lens[first : len(q_lens)].astype(np.int64) - chunks
        long = self.long_tile_pays(chunks, prefixes)
        block_m = LONG_TILE[0] if long else prefill_block_m(self.head_dim, self.dtype, int(chunks.max()))
        q_tiles = q_tile_count(chunks, block_m)
        tiles = self.tile_map(query_start_loc, seq_lens, first, block_m, self.capacity(q_tiles))
        if not long and not cuts_keys(tiles):
            if not self.graph_long_tile_pays(chunks, prefixes):
                return None
            block_m = LONG_TILE[0]
            tiles = prefill_tile_map(query_start_loc, seq_lens, first, block_m, q_tile_count(chunks, block_m))
        return np.ascontiguousarray(tiles[:, : int((tiles[0] >= 0).sum())]), block_m
