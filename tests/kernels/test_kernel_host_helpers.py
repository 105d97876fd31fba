"""The kernels' host helpers: decode's split count, row order, merge counters and workspace
(`paged_decode_split`), `_common`'s checks and dtype choices, `pdl_supported`, the fp8 cache's capability
check and `host_copy.to_device`. GPU-only branches are reached with the device's queries faked. No kernel
runs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from roseinfer.kernels import _common, paged_decode_split, pdl
from roseinfer.kernels.paged_decode_split import (
    MAX_SPLITS,
    MIN_KEYS_PER_SPLIT,
    PROGRAMS_PER_SM,
    choose_num_splits,
    decode_order,
    live_counters,
    merge_counters,
    split_workspace,
)
from roseinfer.kv import cache_dtype
from roseinfer.runner import host_copy

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


@pytest.mark.parametrize("sms", [4, 16, 132])
def test_choose_num_splits_is_the_fewest_that_fill_the_gpu(monkeypatch: pytest.MonkeyPatch, sms: int) -> None:
    """Splits are added one at a time while the programs fall short of the target, every split keeps at
    least MIN_KEYS_PER_SPLIT keys of the longest sequence, and there are at most MAX_SPLITS."""
    monkeypatch.setattr(paged_decode_split, "num_sms", lambda device: sms)
    rng = np.random.default_rng(sms)
    cases = [(0, 8, 4096), (1, 1, 0), (1, 1, 1), (1, 1, 256), (1, 1, 257), (1, 8, 1 << 20), (3, 2, 512)]
    cases += [
        (int(b), int(h), int(n))
        for b, h, n in zip(
            rng.integers(0, 300, 200), rng.choice([1, 2, 4, 8], 200), rng.integers(0, 70000, 200), strict=True
        )
    ]
    for batch, heads, max_seq_len in cases:
        programs, target, want = max(1, batch * heads), PROGRAMS_PER_SM * sms, 1
        while programs * want < target and want * MIN_KEYS_PER_SPLIT < max_seq_len and want < MAX_SPLITS:
            want += 1
        assert choose_num_splits(batch, heads, max_seq_len, CPU) == want, (batch, heads, max_seq_len)


def test_decode_order_is_longest_first_ties_in_row_order() -> None:
    rng = np.random.default_rng(3)
    for _ in range(100):
        lens = rng.choice([0, 1, 16, 17, 300, 4096], size=int(rng.integers(0, 40))).astype(np.int32)
        want = sorted(range(len(lens)), key=lambda i: (-int(lens[i]), i))
        got = decode_order(lens)
        assert got.dtype == np.int32 and got.tolist() == want


def test_merge_counters_are_one_zeroed_buffer_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paged_decode_split, "_COUNTERS", {})
    first = merge_counters(CPU, 10)
    assert live_counters(CPU) is first and first.dtype == torch.int32 and first.numel() >= 10
    assert int(first.count_nonzero()) == 0
    # A later launch of any size up to what the buffer holds shares it (no allocation: it may be under capture).
    assert merge_counters(CPU, 4000) is first
    assert merge_counters(CPU, first.numel()) is first
    bigger = merge_counters(CPU, first.numel() + 1)
    assert (
        bigger.numel() > first.numel() and live_counters(CPU) is bigger and int(bigger.count_nonzero()) == 0
    )


def test_merge_counters_key_cuda_as_the_current_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cuda` and `cuda:<current>` share one buffer; growing it during CUDA-graph capture is refused."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    held = torch.zeros(64, dtype=torch.int32)
    monkeypatch.setattr(paged_decode_split, "_COUNTERS", {torch.device("cuda", 1): held})
    assert live_counters(CUDA) is held
    assert live_counters(torch.device("cuda", 1)) is held
    assert merge_counters(CUDA, 64) is held
    assert live_counters(torch.device("cuda", 0)) is None
    with pytest.raises(RuntimeError, match="eager step"):
        merge_counters(CUDA, 65)


def test_split_workspace_shapes_and_a_counter_per_sequence_and_kv_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(paged_decode_split, "_COUNTERS", {})
    batch, hq, hkv, splits, d = 40000, 4, 2, 3, 1  # more (sequence, kv head) pairs than a fresh buffer holds
    part_m, part_l, part_acc, counters = split_workspace(batch, hq, hkv, splits, d, CPU)
    assert part_m.shape == part_l.shape == (batch, hq, splits) and part_acc.shape == (batch, hq, splits, d)
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in (part_m, part_l, part_acc))
    assert counters.numel() >= batch * hkv and int(counters.count_nonzero()) == 0


def test_cdiv_and_next_power_of_2_are_tritons_for_host_ints() -> None:
    """`_common`'s host copies give what `triton.cdiv` and `triton.next_power_of_2` give: over a range around 0,
    powers of two and their neighbours, both widths, and numpy integers."""
    values = [*range(-40, 300), *(2**e + d for e in (10, 16, 31, 32, 40) for d in (-1, 0, 1))]
    for n in [*values, np.int64(17), np.int32(64), np.int64(2**33 + 1)]:
        assert _common.next_power_of_2(n) == triton.next_power_of_2(n), n
        assert type(_common.next_power_of_2(n)) is int
        for d in (1, 3, 16, 64, 1000):
            assert _common.cdiv(n, d) == triton.cdiv(n, d), (n, d)


def test_dot_types_and_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _common.dot_precision(torch.float32) == "ieee"  # fp32 dots must not drop to tf32
    for dtype in (torch.float16, torch.bfloat16):
        assert _common.dot_precision(dtype) != "ieee"
    monkeypatch.setattr(_common, "is_interpret", lambda: False)
    assert _common.dot_dtype(torch.bfloat16) == tl.bfloat16  # compiled bf16 dots stay bf16
    assert _common.dot_dtype(torch.float16) == tl.float16 and _common.dot_dtype(torch.float32) == tl.float32
    monkeypatch.setattr(_common, "is_interpret", lambda: True)
    assert _common.dot_dtype(torch.bfloat16) == tl.float32
    with pytest.raises(ValueError, match="unsupported dtype"):
        _common.dot_dtype(torch.float8_e4m3fn)


def test_max_shared_memory_asks_no_gpu_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_gpu(index: int) -> int:
        raise AssertionError("asked the GPU")

    monkeypatch.setattr(_common, "_cuda_max_shared", no_gpu)
    monkeypatch.setattr(_common, "is_interpret", lambda: True)
    assert _common.max_shared_memory(CUDA) is None
    assert _common.max_shared_memory(CPU) is None


def test_check_paged_cache_rejects_what_the_kernels_cannot_read() -> None:
    k = torch.zeros(3, 16, 2, 8)
    assert _common.check_paged_cache(k, k.clone(), torch.float32) == (16, 2, 8)
    assert _common.check_paged_cache(k, k.to(torch.float8_e5m2), torch.float32) == (16, 2, 8)
    bad = {
        "dtype": (k, k.half()),
        "shape": (k, torch.zeros(3, 16, 2, 16)),
        "same shape": (k, torch.zeros(3, 16, 1, 8)),
        "contiguous": (k, torch.zeros(3, 16, 8, 2).transpose(-1, -2)),
        "power of two": (torch.zeros(3, 12, 2, 8), torch.zeros(3, 12, 2, 8)),
    }
    for what, (kc, vc) in bad.items():
        with pytest.raises(ValueError):
            _common.check_paged_cache(kc, vc, torch.float32)
            pytest.fail(f"accepted a cache of the wrong {what}")


def test_gather_sequence_kv_walks_the_block_table() -> None:
    rng = np.random.default_rng(9)
    for block_size in (1, 2, 4, 16):
        k = torch.randn(9, block_size, 2, 4)
        v = torch.randn(9, block_size, 2, 4)
        table = torch.from_numpy(rng.permutation(9)).to(torch.int32)
        for n in (0, 1, block_size, block_size + 1, 9 * block_size):
            gk, gv = _common.gather_sequence_kv(k, v, table, n)
            want = [(int(table[i // block_size]), i % block_size) for i in range(n)]
            assert gk.shape == (n, 2, 4)
            for i, (blk, off) in enumerate(want):
                assert torch.equal(gk[i], k[blk, off]) and torch.equal(gv[i], v[blk, off])


def test_pdl_needs_a_compiled_sm90_device(monkeypatch: pytest.MonkeyPatch) -> None:
    caps = {0: (8, 9), 1: (9, 0), 2: (10, 0), 3: (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: caps[index])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(pdl, "is_interpret", lambda: False)
    assert [pdl.pdl_supported(torch.device("cuda", i)) for i in range(4)] == [False, True, True, False]
    assert pdl.pdl_supported(CUDA)  # the current device, 1
    assert not pdl.pdl_supported(CPU)
    monkeypatch.setattr(pdl, "is_interpret", lambda: True)
    assert not pdl.pdl_supported(torch.device("cuda", 1))


def test_fp8_cache_capability_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    for cap, ok in (((8, 6), False), ((8, 9), True), ((9, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cap=cap: cap)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake")
        for fp8 in cache_dtype.FP8_DTYPES:
            if ok:
                cache_dtype.check_fp8_cache_support(fp8, CUDA, "triton")
            else:
                with pytest.raises(ValueError, match="8.9"):
                    cache_dtype.check_fp8_cache_support(fp8, CUDA, "triton")
    assert cache_dtype.FP8_DTYPES == (torch.float8_e4m3fn, torch.float8_e5m2)


def test_to_device_keeps_the_cpu_array_and_copies_through_pinned_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    array = np.arange(6, dtype=np.int64).reshape(2, 3)
    host = host_copy.to_device(array, CPU)
    assert np.shares_memory(host.numpy(), array)  # no copy on the CPU
    calls: list[tuple] = []

    class Pinned:
        def to(self, device: torch.device, non_blocking: bool = False) -> str:
            calls.append(("to", device, non_blocking))
            return "on device"

    class Host:
        def pin_memory(self) -> Pinned:
            calls.append(("pin",))
            return Pinned()

    monkeypatch.setattr(host_copy, "torch", SimpleNamespace(from_numpy=lambda a: Host()))
    assert host_copy.to_device(array, CUDA) == "on device"
    assert calls == [("pin",), ("to", CUDA, True)]


def test_compiled_tile_configs_are_dot_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every compiled config is a power-of-two tile of at least 16 (what `tl.dot` takes) with 4 or 8 warps;
    decode's K tile is 16 KiB for a half-precision cache at head_dim 64 and 128, and for fp8 at 128."""
    from roseinfer.kernels import prefill_plan

    monkeypatch.setattr(paged_decode_split, "is_interpret", lambda: False)
    monkeypatch.setattr(prefill_plan, "is_interpret", lambda: False)
    for d in (16, 32, 64, 128, 256):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for cache in (dtype, torch.float8_e4m3fn, torch.float8_e5m2):
                for m in (None, 64, 128):
                    m_tile, n_tile, m_warps, m_stages = prefill_plan.prefill_config(d, dtype, cache, m)
                    for tile in (m_tile, n_tile):
                        assert tile >= 16 and tile & (tile - 1) == 0, (d, dtype, cache, m)
                    assert m_warps in (4, 8) and m_stages >= 1
                block_m, block_n, warps, stages = prefill_plan.prefill_config(d, dtype, cache)
                dec_n, dec_warps, dec_stages = paged_decode_split.decode_config(d, dtype, cache)
                for tile in (block_m, block_n, dec_n):
                    assert tile >= 16 and tile & (tile - 1) == 0, (d, dtype, cache)
                assert warps in (4, 8) and dec_warps in (4, 8) and stages >= 1 and dec_stages >= 1
                half_or_d128_fp8 = dtype != torch.float32 and (cache == dtype and d in (64, 128) or d == 128)
                if half_or_d128_fp8:
                    assert dec_n * d * torch.empty(0, dtype=cache).element_size() == 16 * 1024, (
                        d,
                        dtype,
                        cache,
                    )
