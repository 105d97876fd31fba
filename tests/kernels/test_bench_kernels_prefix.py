"""`bench kernels --long-prefix` on the CPU (Triton's interpreter, small shapes): the chunk's FLOPs count exactly the
(query, key) pairs its causal mask keeps, the contiguous copy of the paged keys is in order, roseinfer's kernel and
SDPA's lower-right causal flash agree on the same chunk, and vLLM's FA3 (a stand-in here) is called on the same paged
cache, so that its output is compared with the same reference."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from roseinfer.bench import kernels_prefix as kp
from roseinfer.kernels.paged_prefill_attention import paged_prefill_attention_ref
from tests.kernels.kernel_utils import DEVICE, HAS_CUDA


@pytest.mark.parametrize(("chunk", "prefix"), [(1, 0), (5, 3), (16, 16), (21, 37)])
def test_flops_count_the_pairs_the_mask_keeps(chunk: int, prefix: int) -> None:
    ctx = prefix + chunk
    kept = sum(1 for i, j in itertools.product(range(chunk), range(ctx)) if j <= prefix + i)
    assert kp.prefix_chunk_flops(chunk, prefix, 3, 8) == 4 * 3 * 8 * kept


def test_the_contiguous_copy_reads_the_blocks_in_table_order() -> None:
    blocks, size = 5, 4
    cache = torch.arange(blocks * size, dtype=torch.float32).view(blocks, size, 1, 1)
    table = torch.tensor([3, 0, 4], dtype=torch.int32)
    got = kp.gather_contiguous(cache, table, 10).flatten().tolist()
    assert got == [12, 13, 14, 15, 0, 1, 2, 3, 16, 17]


def fake_fa3(calls: list[dict]):
    """FA3's call as vLLM exposes it, answered by the torch reference over the paged cache it is handed."""

    def fa3(q, k, v, *, max_seqlen_q, cu_seqlens_q, max_seqlen_k, seqused_k, softmax_scale, causal, block_table,
            out, fa_version):  # fmt: skip
        calls.append({"causal": causal, "fa_version": fa_version, "max_seqlen_k": max_seqlen_k})
        out.copy_(
            paged_prefill_attention_ref(
                q, k, v, block_table, cu_seqlens_q, seqused_k, max_seqlen_q, softmax_scale
            )
        )

    return fa3


@pytest.mark.parametrize(("chunk", "prefix"), [(21, 37), (16, 32)])
def test_each_kernel_matches_sdpa_on_the_same_chunk(monkeypatch, chunk: int, prefix: int) -> None:
    calls: list[dict] = []
    monkeypatch.setattr(kp, "vllm_fa3", lambda: fake_fa3(calls))
    times = iter([2.0, 1.0, 4.0])  # ours, SDPA, FA3
    gen = torch.Generator(DEVICE).manual_seed(chunk + prefix)
    rows = kp.bench_prefix_chunk(
        prefix, gen, lambda fn: (fn(), next(times))[1], chunk=chunk, heads=(4, 2, 32)
    )
    assert [r["kernel"] for r in rows] == ["paged_prefill", "sdpa_flash", "vllm_fa3"]
    # the interpreter plans no map; a GPU's planner may cut these few tiles' keys
    plan = r" block_m=default splits=1" if not HAS_CUDA else r" block_m=(default|\d+) splits=\d+"
    assert re.search(plan + "$", rows[0]["shape"]), rows[0]["shape"]
    for row in rows:
        assert row["max_abs_err_vs_sdpa"] < 2e-2, row
    assert [r["x_ours"] for r in rows] == [1.0, 0.5, 2.0]
    flops = kp.prefix_chunk_flops(chunk, prefix, 4, 32)
    assert rows[1]["tflops"] == pytest.approx(flops / 1e-3 / 1e12)
    # the try, the check, the timing
    assert calls == [{"causal": True, "fa_version": 3, "max_seqlen_k": prefix + chunk}] * 3


def test_an_fa3_that_refuses_the_cache_costs_only_its_row(monkeypatch, capsys) -> None:
    def refuses(*args, **kwargs):
        raise RuntimeError("paged KV must be contiguous")

    monkeypatch.setattr(kp, "vllm_fa3", lambda: refuses)
    rows = kp.bench_prefix_chunk(
        16, torch.Generator(DEVICE).manual_seed(1), lambda fn: 1.0, chunk=5, heads=(2, 1, 16)
    )
    assert [r["kernel"] for r in rows] == ["paged_prefill", "sdpa_flash"]
    assert "vLLM's FA3 refused the chunk over 16 cached tokens" in capsys.readouterr().out
