"""Qwen3's q/k norms as one in-place launch (`kernels/qk_norm.py`): the kernel against its torch reference,
and a Qwen3 model running it end to end against HF greedy."""

from __future__ import annotations

import pytest
import torch

import roseinfer.models.layers as layers
import roseinfer.models.llama as llama
from roseinfer import LLM, SamplingParams
from roseinfer.kernels.qk_norm import qk_norm_, qk_norm_ref
from tests.kernels.kernel_utils import DEVICE, DTYPE_IDS, HAS_CUDA, TOL, generator, randn
from tests.models.test_hf_parity import hf_greedy, random_prompts
from tests.models.tiny_models import make_hf_model

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("tokens", "hq", "hkv", "d"),
    [
        (1, 2, 1, 64),
        (5, 16, 8, 128),  # qwen3-0.6b heads: 24 q/k heads, three programs of 8 per token
        (7, 14, 2, 64),  # 16 heads: the second program's tile is full
        (3, 7, 1, 80),  # head_dim not a power of two; 8 heads in one tile
        (4, 5, 2, 32),  # 7 heads: a masked tile
    ],
)
def test_qk_norm_matches_reference(dtype, tokens, hq, hkv, d):
    g = generator("qk", dtype, tokens, hq, hkv, d)
    width = (hq + 2 * hkv) * d
    # A wider buffer sliced to the qkv width: rows strided past the end of v, as views of a bigger tensor.
    qkv = randn((tokens, width + 24), dtype, g)[:, :width]
    # Distinct weights (a swap shows), away from 0 (the check below divides by them).
    q_w = (0.5 + torch.rand(d, generator=g)).to(dtype).to(DEVICE)
    k_w = -(0.2 + 2 * torch.rand(d, generator=g)).to(dtype).to(DEVICE)
    ref = qkv.clone()
    untouched = qkv[:, (hq + hkv) * d :].clone()
    qk_norm_(qkv, hq, hkv, d, q_w, k_w, 1e-6)
    qk_norm_ref(ref, hq, hkv, d, q_w, k_w, 1e-6)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(qkv.float(), ref.float(), atol=atol, rtol=rtol)
    assert torch.equal(qkv[:, (hq + hkv) * d :], untouched)  # v is left alone
    # Each q and k head, divided by its own weight, has unit rms (up to rounding).
    heads = qkv[:, : (hq + hkv) * d].unflatten(1, (-1, d)).float()
    weights = torch.cat([q_w.float().expand(hq, d), k_w.float().expand(hkv, d)])
    rms = (heads / weights).pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), atol=0.02, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize(("hq", "hkv"), [(16, 8), (32, 8)])  # qwen3-0.6b, qwen3-8b
@pytest.mark.parametrize("tokens", [1, 64, 257, 4096])
def test_qk_norm_full_shapes_on_gpu(hq, hkv, tokens):
    g = generator("qk-gpu", hq, hkv, tokens)
    d = 128
    qkv = randn((tokens, (hq + 2 * hkv) * d), torch.bfloat16, g)
    q_w, k_w = (
        (0.2 + 1.8 * torch.rand(d, generator=g)).to(qkv),
        (0.2 + 1.8 * torch.rand(d, generator=g)).to(qkv),
    )
    ref = qk_norm_ref(qkv.clone(), hq, hkv, d, q_w, k_w, 1e-6)
    out = qk_norm_(qkv, hq, hkv, d, q_w, k_w, 1e-6)
    atol, rtol = TOL[torch.bfloat16]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


def test_qk_norm_shape_checked():
    qkv = torch.zeros(2, 2 * 64, device=DEVICE)
    w = torch.ones(64, device=DEVICE)
    with pytest.raises(ValueError, match="fewer than"):
        qk_norm_(qkv, 2, 1, 64, w, w, 1e-6)  # 2 q heads and 1 k head of 64 need 192 columns
    with pytest.raises(ValueError, match="contiguous last dim"):
        qk_norm_(torch.zeros(4, 256, device=DEVICE).t(), 1, 1, 64, w, w, 1e-6)
    empty = torch.zeros(0, 4 * 64, device=DEVICE)
    assert qk_norm_(empty, 2, 1, 64, w, w, 1e-6) is empty


def test_qwen3_with_one_qk_norm_launch_matches_hf(tmp_path, monkeypatch):
    """On a GPU every Qwen3 step takes the kernel; on the CPU the model is made to take it (interpreter)."""
    model = make_hf_model("qwen3")
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():  # q and k norm weights far from 1 and from each other
        for name, p in model.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                p.copy_(0.2 + 1.8 * torch.rand(p.shape, generator=g))
    model.save_pretrained(tmp_path, safe_serialization=True)
    launches = []
    real = layers._qk_norm.qk_norm_

    def counting(*args, **kwargs):
        launches.append(args[0].shape[0])
        return real(*args, **kwargs)

    if not HAS_CUDA:
        monkeypatch.setattr(layers, "fused_kernels_for", lambda x: True)
        monkeypatch.setattr(llama, "fused_kernels_for", lambda x: True)
    monkeypatch.setattr(layers._qk_norm, "qk_norm_", counting)
    prompts = random_prompts(model.config.vocab_size, seed=26, lengths=[5, 18])
    llm = LLM(
        str(tmp_path),
        device=str(DEVICE),
        dtype="float32",
        block_size=16,
        cpu_kv_tokens=1024,
        attention_backend="triton",
        one_token_gemv=False,
        enforce_eager=True,  # a graph replay would run the kernel without calling the counted function
        num_kv_blocks=64,  # on a GPU that other test processes share, not 0.9 of it
    )
    launches.clear()  # start-up may run warm-up forwards (CUDA)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(model, p, 3) for p in prompts]
    # One prefill step of 23 tokens, then two decode steps of 2 rows: one launch per layer each.
    n = model.config.num_hidden_layers
    assert launches == [23] * n + [2] * (2 * n)
