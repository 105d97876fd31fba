"""Fused RMSNorm(+residual), rotary and SiLU-and-mul against their torch references."""

from __future__ import annotations

import pytest
import torch

from roseinfer.kernels import rmsnorm as rmsnorm_module
from roseinfer.kernels.activation import silu_and_mul, silu_and_mul_ref
from roseinfer.kernels.kv_store import store_kv_ref
from roseinfer.kernels.rmsnorm import rmsnorm, rmsnorm_ref, scale_by_inv_rms_ref
from roseinfer.kernels.rotary import apply_rotary, apply_rotary_and_store_kv, apply_rotary_ref
from tests.kernels.kernel_utils import DEVICE, DTYPE_IDS, TOL, generator, head_major_copy, randn

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOL[dtype]
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize(("rows", "cols"), [(1, 64), (7, 96), (3, 896), (5, 1000)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm(dtype, rows, cols, with_residual):
    g = generator("rms", dtype, rows, cols, with_residual)
    x, w = randn((rows, cols), dtype, g), 1 + 0.1 * randn((cols,), dtype, g)
    res = randn((rows, cols), dtype, g) if with_residual else None
    res_ref = res.clone() if res is not None else None
    out = rmsnorm(x, w, 1e-6, res)
    ref = rmsnorm_ref(x, w, 1e-6, res_ref)
    close(out, ref, dtype)
    if with_residual:
        close(res, res_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("tokens", "hq", "hk", "d"),
    # 40 q and 20 k heads: more than one 16-head chunk of a token's heads (hq > 16 at llama-3.1-8b's 32).
    [(1, 4, 2, 16), (9, 14, 2, 64), (5, 8, 8, 128), (3, 3, 1, 32), (2, 40, 20, 16)],
)
def test_rotary_in_place_on_strided_views(dtype, tokens, hq, hk, d):
    g = generator("rope", dtype, tokens, hq, hk, d)
    qkv = randn((tokens, (hq + 2 * hk) * d), dtype, g)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(tokens, hk, d)
    v_before = qkv[:, (hq + hk) * d :].clone()
    max_pos = 64
    angles = torch.rand((max_pos, d // 2), generator=g) * 6.28
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(DEVICE)
    positions = torch.randint(0, max_pos, (tokens,), generator=g).to(torch.int32).to(DEVICE)
    q_ref, k_ref = apply_rotary_ref(q.clone(), k.clone(), positions, cos_sin)
    apply_rotary(q, k, positions, cos_sin)
    close(q, q_ref, dtype)
    close(k, k_ref, dtype)
    assert torch.equal(qkv[:, (hq + hk) * d :], v_before)  # v untouched


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("tokens", "hq", "hk", "d", "block_size"),
    # (3, 32, 20, 16, 4): more than one 16-head chunk of q, k and v heads (MHA models have 32 kv heads).
    [(1, 4, 2, 16, 16), (9, 14, 2, 64, 16), (5, 8, 8, 128, 1), (17, 3, 1, 32, 4), (3, 32, 20, 16, 4)],
)
def test_rotary_and_store_kv(dtype, tokens, hq, hk, d, block_size):
    """q rotated in place; k rotated into its cache slot (k itself untouched); v copied; -1 slots skipped;
    slot 0 (block 0 is an ordinary block) written."""
    g = generator("rope-store", dtype, tokens, hq, hk, d, block_size)
    qkv = randn((tokens, (hq + 2 * hk) * d), dtype, g)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(tokens, hk, d)
    v = qkv[:, (hq + hk) * d :].view(tokens, hk, d)
    k_before = k.clone()
    num_blocks, num_layers = tokens + 2, 2
    kv = randn((num_blocks, num_layers, 2, block_size, hk, d), dtype, g)
    k_cache, v_cache = kv[:, 1, 0], kv[:, 1, 1]  # a layer's strided views, as the engine passes them
    kv_ref = kv.clone()
    slots = torch.randperm(num_blocks * block_size - 1, generator=g)[:tokens] + 1  # distinct, 0 set below
    slots[torch.rand(tokens, generator=g) < 0.25] = -1  # padding rows
    slots[tokens // 2] = 0
    slots = slots.to(torch.int32).to(DEVICE)
    angles = torch.rand((64, d // 2), generator=g) * 6.28
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(DEVICE)
    positions = torch.randint(0, 64, (tokens,), generator=g).to(torch.int32).to(DEVICE)
    q_ref, k_rot = apply_rotary_ref(q.clone(), k.clone(), positions, cos_sin)
    store_kv_ref(k_rot, v, kv_ref[:, 1, 0], kv_ref[:, 1, 1], slots)
    apply_rotary_and_store_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slots)
    close(q, q_ref, dtype)
    assert torch.equal(k, k_before)
    close(kv, kv_ref, dtype)


def test_rotary_and_store_kv_into_a_v_cache_of_another_layout():
    """k and v caches are written through their own strides: nothing but the same shape ties them."""
    g = generator("rope-store-v-layout")
    tokens, hq, hk, d, block_size, num_blocks = 5, 4, 2, 16, 4, 4
    q, k, v = (randn((tokens, h, d), torch.float32, g) for h in (hq, hk, hk))
    k_cache = torch.zeros((num_blocks, block_size, hk, d), device=DEVICE)
    v_cache = head_major_copy(torch.zeros_like(k_cache))
    slots = torch.tensor([3, 0, -1, 14, 9], dtype=torch.int32, device=DEVICE)
    angles = torch.rand((16, d // 2), generator=g) * 6.28
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(DEVICE)
    positions = torch.randint(0, 16, (tokens,), generator=g).to(torch.int32).to(DEVICE)
    q_ref, k_rot = apply_rotary_ref(q.clone(), k.clone(), positions, cos_sin)
    k_ref, v_ref = torch.zeros_like(k_cache), torch.zeros_like(k_cache)
    store_kv_ref(k_rot, v, k_ref, v_ref, slots)
    apply_rotary_and_store_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slots)
    close(q, q_ref, torch.float32)
    close(k_cache, k_ref, torch.float32)
    close(v_cache, v_ref, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize(("rows", "inter"), [(1, 16), (6, 112), (3, 1500)])
def test_silu_and_mul(dtype, rows, inter):
    x = randn((rows, 2 * inter), dtype, generator("silu", dtype, rows, inter))
    close(silu_and_mul(x), silu_and_mul_ref(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("rows", "inter", "hidden"), [(1, 16, 7), (6, 112, 96), (3, 1500, 1500), (2, 64, 2048)]
)
def test_silu_and_mul_deferred_norm(dtype, rows, inter, hidden):
    """gate_up computed from rows before their RMSNorm: the kernel scales by 1/rms of those rows first. The
    rows are far from unit rms (and there are more of them than x has, as with padded batches)."""
    g = generator("silu-norm", dtype, rows, inter, hidden)
    x = randn((rows, 2 * inter), dtype, g)
    rows_before_norm = 30 * randn((rows + 2, hidden), dtype, g)
    out = silu_and_mul(x, rms_of=rows_before_norm, eps=1e-6)
    close(out, silu_and_mul_ref(x, rms_of=rows_before_norm, eps=1e-6), dtype)
    assert not torch.allclose(out.float(), silu_and_mul_ref(x).float(), atol=0.1)


def test_silu_and_mul_deferred_norm_row_in_chunks(monkeypatch):
    """Rows wider than ROW_CHUNK_MAX are summed over several chunks, the last one partial."""
    monkeypatch.setattr(rmsnorm_module, "ROW_CHUNK_MAX", 256)
    g = generator("silu-norm-chunks")
    x = randn((3, 2 * 40), torch.float32, g)
    rows_before_norm = 30 * randn((3, 1000), torch.float32, g)
    close(
        silu_and_mul(x, rms_of=rows_before_norm, eps=1e-6),
        silu_and_mul_ref(x, rows_before_norm, 1e-6),
        torch.float32,
    )


def test_silu_and_mul_rms_of_shape_checked():
    x = torch.zeros(4, 32, device=DEVICE)
    with pytest.raises(ValueError, match="rms_of"):
        silu_and_mul(x, rms_of=torch.zeros(3, 8, device=DEVICE))


def test_folded_norm_weight_identity():
    """The algebra the deferred norm rests on: norm(x; g) @ W.T == (x @ (W * g).T) / rms(x) (float64 inputs;
    the references compute the norm in float32)."""
    g = generator("fold")
    x = torch.randn(5, 48, generator=g, dtype=torch.float64) * 7
    w = torch.randn(40, 48, generator=g, dtype=torch.float64)
    gain = 1 + 0.5 * torch.randn(48, generator=g, dtype=torch.float64)
    bias = torch.randn(40, generator=g, dtype=torch.float64)
    want = rmsnorm_ref(x, gain, 1e-6) @ w.T + bias
    got = scale_by_inv_rms_ref(x @ (w * gain).T, x, 1e-6, bias)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_rotary_ref_matches_model_rotary():
    from roseinfer.models.layers import RotaryEmbedding

    rope = RotaryEmbedding(32, 128, 10000.0, None)
    rope.build(torch.device("cpu"))
    g = generator("rope-model")
    q, k = torch.randn(5, 4, 32, generator=g), torch.randn(5, 2, 32, generator=g)
    pos = torch.tensor([0, 3, 17, 64, 127])
    want_q, want_k = rope(pos, q, k)
    got_q, got_k = apply_rotary_ref(q, k, pos, rope.cos_sin)
    torch.testing.assert_close(got_q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k, want_k, atol=1e-5, rtol=1e-5)
