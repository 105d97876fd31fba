"""Mutation audit (attention/backend.py, torch_backend.py, triton_backend.py, models/layers.paged_attention):
padding rows and slot 0 in the reference backend, the deferred-norm contract, unknown backend names. Outputs
are checked against a dense causal softmax of each sequence (`_Batch.expected`)."""

from __future__ import annotations

import pytest
import torch

from roseinfer.attention.backend import AttentionBackend, get_backend
from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.kernels.decode_new_token import DeferredNorm
from roseinfer.models.layers import ForwardContext, RotaryEmbedding, paged_attention
from tests.kernels.kernel_utils import DEVICE, TOL, generator
from tests.kernels.test_triton_backend import _Batch


def _changed_slots(before: torch.Tensor, after: torch.Tensor) -> set[tuple[int, int]]:
    """(block, offset) pairs of layer 0 whose K or V changed."""
    diff = (before[:, 0] != after[:, 0]).any(dim=(1, 3, 4))  # [blocks, block_size]
    return {(int(b), int(o)) for b, o in diff.nonzero().tolist()}


def _new_slots(batch: _Batch) -> set[tuple[int, int]]:
    bs = batch.k_cache.shape[1]
    return {(s // bs, s % bs) for s in batch.meta.slot_mapping.tolist() if s >= 0}


@pytest.mark.parametrize("num_pad", [1, 3])
def test_torch_backend_padding_rows_write_nothing_and_read_zero(num_pad):
    """Rows with slot -1 (graph padding) neither land in the cache nor get an output: only the real rows'
    slots change, the real rows match the dense reference, the padding rows are zero."""
    gen = generator("torch-backend-padding", num_pad)
    batch = _Batch([20, 0, 5], [1, 6, 2], num_pad, 4, 2, 16, 8, torch.float32, gen)
    before = batch.kv.clone()
    out = get_backend("torch").forward(
        batch.q, batch.k_new, batch.v_new, batch.k_cache, batch.v_cache, batch.meta, batch.scale
    )
    atol, rtol = TOL[torch.float32]
    torch.testing.assert_close(out[: batch.num_real], batch.expected(), atol=atol, rtol=rtol)
    assert torch.equal(out[batch.num_real :], torch.zeros_like(out[batch.num_real :]))
    assert _changed_slots(before, batch.kv) <= _new_slots(batch)


def test_torch_backend_writes_and_reads_slot_zero():
    """Block 0, offset 0 is a slot like any other (the block pool hands block 0 out)."""
    gen = torch.Generator().manual_seed(11)
    n, heads, kv_heads, d, bs = 5, 4, 2, 16, 4
    kv = torch.zeros((3, 1, 2, bs, kv_heads, d))
    q = torch.randn((n, heads, d), generator=gen)
    k = torch.randn((n, kv_heads, d), generator=gen)
    v = torch.randn((n, kv_heads, d), generator=gen)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, dtype=torch.int64),  # block 0 then block 1
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_tables=torch.tensor([[0, 1]], dtype=torch.int32),
        max_query_len=n,
        max_seq_len=n,
        query_start_loc_cpu=[0, n],
        seq_lens_cpu=[n],
    )
    out = get_backend("torch").forward(q, k, v, kv[:, 0, 0], kv[:, 0, 1], meta, d**-0.5)
    assert torch.equal(kv[0, 0, 0, 0], k[0]) and torch.equal(kv[0, 0, 1, 0], v[0])
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) * d**-0.5
    scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
    want = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def _norm_for(batch: _Batch) -> DeferredNorm:
    return DeferredNorm(torch.ones((batch.q.shape[0], 8)), 1e-6)


def test_torch_backend_refuses_a_deferred_norm():
    batch = _Batch([3], [1], 0, 4, 2, 16, 8, torch.float32, generator("torch-norm"))
    with pytest.raises(ValueError, match="deferred norm"):
        get_backend("torch").forward(
            batch.q, batch.k_new, batch.v_new, batch.k_cache, batch.v_cache, batch.meta, batch.scale,
            norm=_norm_for(batch),
        )  # fmt: skip


def test_triton_backend_refuses_a_deferred_norm_on_a_step_with_prefill_work():
    batch = _Batch([3, 0], [1, 4], 0, 4, 2, 16, 8, torch.float32, generator("triton-norm"))
    assert not batch.meta.is_decode_only
    before = batch.kv.clone()
    with pytest.raises(ValueError, match="decode-only"):
        get_backend("triton").forward(
            batch.q, batch.k_new, batch.v_new, batch.k_cache, batch.v_cache, batch.meta, batch.scale,
            norm=_norm_for(batch),
        )  # fmt: skip
    assert torch.equal(batch.kv, before), "refused, yet the step's K/V was stored"


class _DefersNormButNotRotary(AttentionBackend):
    """A backend that would finish q/k/v itself but leaves rotary to the model: rotating the unfinished
    projections first would be wrong, so paged_attention must refuse before calling it."""

    name = "defers-norm-only"
    defers_norm = True
    calls = 0

    def forward(self, q, k, v, k_cache, v_cache, meta, scale, rope=None, norm=None):
        self.calls += 1
        return q


def test_paged_attention_refuses_a_deferred_norm_it_would_rotate_first():
    batch = _Batch([3], [1], 0, 4, 2, 16, 8, torch.float32, generator("paged-attention-norm"))
    rotary = RotaryEmbedding(16, 64, 10000.0, None)
    rotary.build(torch.device(DEVICE))
    backend = _DefersNormButNotRotary()
    ctx = ForwardContext(batch.kv, batch.meta, backend)
    positions = torch.tensor([3], device=DEVICE)
    with pytest.raises(ValueError, match="before rotary"):
        paged_attention(
            0, batch.q, batch.k_new, batch.v_new, ctx, batch.scale, positions, rotary, _norm_for(batch)
        )
    assert backend.calls == 0


def test_an_unknown_backend_name_is_refused_by_name():
    with pytest.raises(ValueError, match="'flash'.*known"):
        get_backend("flash")
    assert get_backend("torch").name == "torch"


@pytest.mark.parametrize("name", ["torch", "triton"])
def test_a_fresh_interpreter_finds_each_backend_by_name(name):
    """Nothing else imports the backend modules (CPU installs need not import Triton): get_backend must."""
    import os
    import subprocess
    import sys

    code = (
        "import sys; from roseinfer.attention.backend import get_backend; "
        f"assert 'roseinfer.attention.{name}_backend' not in sys.modules; print(get_backend({name!r}).name)"
    )
    env = {**os.environ, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == name
