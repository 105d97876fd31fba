"""TritonAttentionBackend.forward against a tiny direct torch computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from roseinfer.attention.backend import get_backend  # noqa: E402
from roseinfer.attention.metadata import AttentionMetadata  # noqa: E402
from roseinfer.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from roseinfer.kernels.paged_decode_split import decode_order, live_counters  # noqa: E402
from tests.kernels.kernel_utils import DEVICE, TOL, generator, randn  # noqa: E402


def _device_order(seq_lens: np.ndarray, rows: int | None = None) -> torch.Tensor:
    """`decode_order` of `seq_lens`, then rows len(seq_lens)..rows-1 (padding) in row order."""
    tail = np.arange(len(seq_lens), rows or len(seq_lens), dtype=np.int32)
    return torch.from_numpy(np.concatenate([decode_order(seq_lens), tail])).to(DEVICE)


class _Batch:
    """Sequences with cached prefixes and new tokens, laid into a paged cache, plus the dense truth."""

    def __init__(
        self,
        prefix_lens: list[int],
        q_lens: list[int],
        num_pad: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype,
        gen: torch.Generator,
        num_blocks: int | None = None,
        max_blocks: int | None = None,
    ) -> None:
        self.dtype = dtype
        num_layers, layer = 2, 0
        seq_lens = [p + n for p, n in zip(prefix_lens, q_lens, strict=True)]
        blocks_needed = [(n + block_size - 1) // block_size for n in seq_lens]
        num_blocks = num_blocks or sum(blocks_needed) + 2
        self.kv = torch.zeros((num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim), dtype=dtype)
        self.kv = self.kv.to(DEVICE)
        self.k_cache, self.v_cache = self.kv[:, layer, 0], self.kv[:, layer, 1]
        perm = torch.randperm(num_blocks, generator=gen).tolist()
        max_blocks = max_blocks or max(blocks_needed) + 1
        tables = torch.zeros((len(seq_lens), max_blocks), dtype=torch.int32)
        self.full_k: list[torch.Tensor] = []  # dense [seq_len, Hkv, D] per sequence
        self.full_v: list[torch.Tensor] = []
        slots: list[int] = []
        for i, (p, n) in enumerate(zip(prefix_lens, q_lens, strict=True)):
            blocks = [perm.pop() for _ in range(blocks_needed[i])]
            tables[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            k = randn((p + n, num_kv_heads, head_dim), dtype, gen)
            v = randn((p + n, num_kv_heads, head_dim), dtype, gen)
            self.full_k.append(k)
            self.full_v.append(v)
            for t in range(p + n):
                blk, off = blocks[t // block_size], t % block_size
                if t < p:  # cached prefix: already in the cache
                    self.k_cache[blk, off] = k[t]
                    self.v_cache[blk, off] = v[t]
                else:  # new token: the backend stores it
                    slots.append(blk * block_size + off)
        starts = [0]
        for n in q_lens:
            starts.append(starts[-1] + n)
        num_tokens = starts[-1] + num_pad
        self.num_real = starts[-1]
        self.q = randn((num_tokens, num_heads, head_dim), dtype, gen)
        pad_k = randn((num_pad, num_kv_heads, head_dim), dtype, gen)
        self.k_new = torch.cat([k[p:] for k, p in zip(self.full_k, prefix_lens, strict=True)] + [pad_k])
        self.v_new = torch.cat([v[p:] for v, p in zip(self.full_v, prefix_lens, strict=True)] + [pad_k])
        slots += [-1] * num_pad
        self.scale = head_dim**-0.5
        self.prefix_lens, self.q_lens, self.starts = prefix_lens, q_lens, starts
        lead = next((i for i, n in enumerate(q_lens) if n != 1), len(q_lens))
        self.meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
            block_tables=tables.to(DEVICE),
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
            query_start_loc_cpu=starts,
            seq_lens_cpu=seq_lens,
            # The leading decodes served longest first, as the runner sends them.
            decode_order=_device_order(np.array(seq_lens[:lead])),
        )

    def expected(self) -> torch.Tensor:
        """Causal softmax attention per sequence, fp32, on the dense K/V (GQA by repeating kv heads)."""
        group = self.q.shape[1] // self.full_k[0].shape[1]
        outs = []
        for i, (p, n) in enumerate(zip(self.prefix_lens, self.q_lens, strict=True)):
            q = self.q[self.starts[i] : self.starts[i + 1]].float()
            k = self.full_k[i].float().repeat_interleave(group, 1)
            v = self.full_v[i].float().repeat_interleave(group, 1)
            scores = torch.einsum("qhd,khd->hqk", q, k) * self.scale
            causal = (
                torch.arange(p + n, device=DEVICE)[None, :] > torch.arange(p, p + n, device=DEVICE)[:, None]
            )
            scores = scores.masked_fill(causal, float("-inf"))
            outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
        return torch.cat(outs)

    def run(self) -> torch.Tensor:
        backend = get_backend("triton")
        assert isinstance(backend, TritonAttentionBackend) and backend.name == "triton"
        before = self.kv.clone()
        out = backend.forward(
            self.q, self.k_new, self.v_new, self.k_cache, self.v_cache, self.meta, self.scale
        )
        assert out.shape == self.q.shape and out.dtype == self.q.dtype
        atol, rtol = TOL[self.dtype]
        torch.testing.assert_close(out[: self.num_real].float(), self.expected(), atol=atol, rtol=rtol)
        assert not torch.isnan(out).any()
        # The new K/V landed in the cache; padding rows (slot -1) wrote nothing else.
        changed = (self.kv != before).any(dim=(1, 2, 4, 5)).sum().item()  # (block, offset) pairs changed
        assert changed <= sum(self.q_lens)
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_backend_mixed_batch(dtype: torch.dtype) -> None:
    # A decode (prefix 20), a chunk after a cached prefix, and a fresh prefill, in one step.
    gen = generator("backend-mixed", dtype)
    batch = _Batch([20, 7, 0], [1, 5, 9], 0, 4, 2, 32, 16, dtype, gen)
    assert not batch.meta.is_decode_only
    batch.run()


@pytest.mark.parametrize(
    "prefix_lens, q_lens, num_pad",
    [
        ([20, 33, 0, 5], [1, 1, 7, 1], 0),  # two leading decodes, a prefill, then a 1-token chunk
        ([16, 17, 15, 3, 0], [1, 1, 1, 16, 17], 3),  # three decodes at block boundaries, padding rows
        ([0, 40], [3, 1], 0),  # a prefill first: no leading decodes
        ([47, 1], [1, 2], 1),
    ],
)
def test_backend_leading_decodes_take_the_decode_kernel(prefix_lens, q_lens, num_pad) -> None:
    gen = generator(f"backend-leading-{q_lens}")
    batch = _Batch(prefix_lens, q_lens, num_pad, 6, 2, 32, 16, torch.float32, gen)
    lead = next((i for i, n in enumerate(q_lens) if n != 1), len(q_lens))
    longest = max((p + 1 for p in prefix_lens[:lead]), default=0)
    assert batch.meta.leading_decodes == (lead, longest)
    out = batch.run()
    assert torch.equal(out[batch.num_real :], torch.zeros_like(out[batch.num_real :]))


@pytest.mark.parametrize("q_lens", [[1, 5, 9], [1, 1, 1]], ids=["mixed", "decode"])
def test_backend_fused_rotary_equals_rotating_first(q_lens) -> None:
    """forward(rope=...) rotates q and k inside the KV write: same output and cache as rotating first."""
    from roseinfer.kernels.rotary import apply_rotary_ref

    gen = generator("backend-rope", q_lens)
    prefix_lens = [20, 7, 0]
    batch = _Batch(prefix_lens, q_lens, 1, 4, 2, 32, 16, torch.float32, gen)
    positions = torch.tensor(
        [p + j for p, n in zip(prefix_lens, q_lens) for j in range(n)] + [0], dtype=torch.int32, device=DEVICE
    )
    angles = torch.rand((64, 16), generator=gen) * 6.28
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(DEVICE)
    backend = get_backend("triton")
    assert backend.fuses_rotary
    kv_before = batch.kv.clone()
    q_rot, k_rot = apply_rotary_ref(batch.q, batch.k_new, positions, cos_sin)
    want = backend.forward(q_rot, k_rot, batch.v_new, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    kv_want = batch.kv.clone()
    batch.kv.copy_(kv_before)
    q = batch.q.clone()
    got = backend.forward(
        q,
        batch.k_new,
        batch.v_new,
        batch.k_cache,
        batch.v_cache,
        batch.meta,
        batch.scale,
        (positions, cos_sin),
    )
    atol, rtol = TOL[torch.float32]
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    torch.testing.assert_close(batch.kv, kv_want, atol=atol, rtol=rtol)
    with pytest.raises(ValueError, match="does not fuse rotary"):
        get_backend("torch").forward(
            q,
            batch.k_new,
            batch.v_new,
            batch.k_cache,
            batch.v_cache,
            batch.meta,
            batch.scale,
            (positions, cos_sin),
        )


def test_backend_decode_only_with_padding_row() -> None:
    gen = generator("backend-decode")
    batch = _Batch([20, 16, 0], [1, 1, 1], 2, 6, 2, 32, 16, torch.float32, gen)
    assert batch.meta.is_decode_only
    # Padding rows have no sequence: give the metadata one zero-length "sequence" per padding row.
    m = batch.meta
    m.seq_lens = torch.cat([m.seq_lens, torch.zeros(2, dtype=torch.int32, device=DEVICE)])
    m.block_tables = torch.cat([m.block_tables, torch.zeros_like(m.block_tables[:2])])
    m.query_start_loc = torch.arange(6, dtype=torch.int32, device=DEVICE)
    m.query_start_loc_cpu = list(range(6))
    m.seq_lens_cpu = m.seq_lens_cpu + [0, 0]
    m.decode_order = _device_order(np.array(m.seq_lens_cpu[:3]), 5)
    out = batch.run()
    assert torch.equal(out[3:], torch.zeros_like(out[3:]))


@pytest.mark.gpu
def test_backend_decode_cuda_graph() -> None:
    """Capture decode in a CUDA graph, then replay it with other lengths, slots, tables and queries."""
    gen = generator("backend-graph")
    shape = dict(num_pad=0, num_heads=14, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.bfloat16)
    cap = dict(num_blocks=1100, max_blocks=257)
    first = _Batch([100, 3000, 17, 1], [1, 1, 1, 1], gen=gen, **shape, **cap)  # type: ignore[arg-type]
    meta = first.meta
    meta.max_seq_len = 4096  # capture for the longest context the graph must serve
    backend = get_backend("triton")
    static_q, static_k, static_v = first.q.clone(), first.k_new.clone(), first.v_new.clone()
    args = (first.k_cache, first.v_cache, meta, first.scale)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            backend.forward(static_q, static_k, static_v, *args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = backend.forward(static_q, static_k, static_v, *args)

    # The next step: same shapes, new lengths and contents, written into the captured tensors.
    second = _Batch([2047, 5, 4094, 64], [1, 1, 1, 1], gen=gen, **shape, **cap)  # type: ignore[arg-type]
    first.kv.copy_(second.kv)
    for name in ("slot_mapping", "seq_lens", "block_tables", "decode_order"):
        getattr(meta, name).copy_(getattr(second.meta, name))
    static_q.copy_(second.q)
    static_k.copy_(second.k_new)
    static_v.copy_(second.v_new)
    graph.replay()
    torch.cuda.synchronize()
    atol, rtol = TOL[torch.bfloat16]
    torch.testing.assert_close(static_out.float(), second.expected(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("long_tile", [False, True])
def test_warm_up_reads_the_cache_and_writes_nothing(long_tile: bool) -> None:
    """The warm-up runs the mixed-step decode kernel once per split bucket on block 0, and with `long_tile`
    LONG_TILE's two tile-map launches (one cutting keys): the cache and the merge counters must come out as
    they went in."""
    gen = torch.Generator().manual_seed(3)
    kv = torch.randn((4, 1, 2, 16, 2, 32), generator=gen).to(DEVICE)
    before = kv.clone()
    TritonAttentionBackend().warm_up(
        kv[:, 0, 0], kv[:, 0, 1], num_heads=4, dtype=kv.dtype, long_tile=long_tile
    )
    assert torch.equal(kv, before)
    counters = live_counters(torch.device(DEVICE))
    assert counters is None or not counters.any()


@pytest.mark.parametrize(
    "prefix_lens, q_lens, num_pad, num_seqs",
    [
        ([20, 33, 0, 5], [1, 1, 7, 1], 4, 6),  # two leading decodes, a prefill, a 1-token chunk; padding
        ([16, 17, 3, 0], [1, 1, 16, 17], 1, 5),  # decodes at block boundaries, chunks at tile edges
        ([0, 40], [3, 1], 11, 16),  # no leading decodes; more sequence rows than tokens would need
        ([9, 30], [1, 1], 2, 4),  # decodes only: every tile spare
        ([40, 70, 150], [1, 3, 20], 3, 5),  # chunks over long prefixes: their keys are cut when allowed
        ([600, 20], [1, 5], 2, 8),  # a lone long decode: the decode kernel cuts it into splits on the GPU
    ],
)
@pytest.mark.parametrize("key_split", [False, True], ids=["tiles", "key-splits"])
def test_backend_fixed_shape_mixed_step(prefix_lens, q_lens, num_pad, num_seqs, key_split) -> None:
    """The mixed-step graphs' path (every launch shape fixed by the graph's size): padded sequences of
    length 0, the decode kernel over the first `num_seqs` rows, the prefill kernel over a tile map with
    spare programs, which may cut tiles' keys. Same output as the reference; padding rows zero."""

    from roseinfer.kernels.prefill_plan import SPLIT_PARTIAL_ROWS, KeySplit, prefill_tile_map

    gen = generator(f"backend-fixed-{q_lens}")
    batch = _Batch(prefix_lens, q_lens, num_pad, 6, 2, 32, 16, torch.float32, gen)
    m, b, t = batch.meta, len(q_lens), batch.q.shape[0]
    num_seqs = min(num_seqs, t)
    starts = np.array(m.query_start_loc_cpu + [batch.num_real] * (num_seqs - b), np.int32)
    seq_lens = np.array(m.seq_lens_cpu + [0] * (num_seqs - b), np.int32)
    decodes = next((i for i, n in enumerate(q_lens) if n != 1), b)
    block_m = 16
    split = KeySplit(num_heads=6, block_n=16, wave=64, min_keys=16) if key_split else None
    tiles = prefill_tile_map(starts, seq_lens, decodes, block_m, -(-t // block_m) + b + 8, split)
    if key_split and max(prefix_lens[decodes:], default=0) >= 64:
        assert (tiles[3] > 1).any(), "no tile's keys were cut: the case tests nothing new"
    tables = torch.zeros((num_seqs, m.block_tables.shape[1] + 2), dtype=torch.int32, device=DEVICE)
    tables[:b, : m.block_tables.shape[1]] = m.block_tables
    batch.meta = AttentionMetadata(
        slot_mapping=m.slot_mapping,
        query_start_loc=torch.from_numpy(starts).to(DEVICE),
        seq_lens=torch.from_numpy(seq_lens).to(DEVICE),
        block_tables=tables,
        max_query_len=t,
        max_seq_len=tables.shape[1] * 16,
        query_start_loc_cpu=[],  # a graph has no host copies: the path must not read them
        seq_lens_cpu=[],
        prefill_tiles=torch.from_numpy(tiles).to(DEVICE),
        tile_block_m=block_m,
        split_rows=SPLIT_PARTIAL_ROWS if key_split else 0,
        decode_seq_lens=torch.from_numpy(np.where(np.arange(num_seqs) < decodes, seq_lens, 0)).to(DEVICE),
        decode_count=torch.tensor([decodes], dtype=torch.int32, device=DEVICE),
        decode_order=_device_order(seq_lens[:decodes], num_seqs),
    )
    out = batch.run()
    assert torch.equal(out[batch.num_real :], torch.zeros_like(out[batch.num_real :]))


def test_backend_eager_step_with_key_splits() -> None:
    """An eager step whose chunks sit over long prefixes: the planner's tile map cuts their keys across
    programs; the decodes in front still take the decode kernel. Same output as the reference."""
    from dataclasses import replace

    from roseinfer.kernels.prefill_plan import SPLIT_PARTIAL_ROWS, TilePlanner

    gen = generator("backend-eager-split")
    batch = _Batch([20, 300, 170, 0], [1, 5, 19, 3], 2, 6, 2, 32, 16, torch.float32, gen)
    planner = TilePlanner(6, 32, torch.float32, DEVICE)
    planner.split = replace(planner.split, wave=96, min_keys=64)
    starts, seq_lens = np.array(batch.meta.query_start_loc_cpu), np.array(batch.meta.seq_lens_cpu)
    planned = planner.eager_map(starts, seq_lens)
    assert planned is not None
    tiles, block_m = planned
    assert (tiles[3] > 1).any() and (tiles[0] >= 1).all()  # seq 0 (a decode) is left to the decode kernel
    batch.meta.prefill_tiles = torch.from_numpy(tiles).to(DEVICE)
    batch.meta.tile_block_m, batch.meta.split_rows = block_m, SPLIT_PARTIAL_ROWS
    out = batch.run()
    assert torch.equal(out[batch.num_real :], torch.zeros_like(out[batch.num_real :]))
    assert int(live_counters(DEVICE).count_nonzero()) == 0


def test_planner_leaves_steps_that_fill_the_gpu_to_the_plain_grid() -> None:
    from dataclasses import replace

    from roseinfer.kernels.prefill_plan import TilePlanner

    planner = TilePlanner(6, 32, torch.float32, DEVICE)
    planner.split = replace(planner.split, wave=48)  # 8 programs of 6 heads in one wave
    target = planner.split.wave
    many = np.array([16] * target, np.int64)  # a q tile each: already target x 6 programs
    starts = np.concatenate([[0], np.cumsum(many)])
    assert planner.eager_map(starts, many + 2000) is None
    one = np.array([0, 1, 2, 7])  # decodes, then a 5-token chunk
    assert planner.eager_map(one[:3], np.array([40, 50])) is None  # decodes only
    assert planner.eager_map(one, np.array([40, 50, 5 + planner.split.min_keys // 2])) is None  # few keys
    planned = planner.eager_map(one, np.array([40, 50, 5 + 8 * planner.split.min_keys]))
    assert planned is not None and (planned[0][3] > 1).any()
