"""An fp8 KV cache (`kv_cache_dtype="fp8"`): the rounding on store against its torch reference, the write
kernels, and whole engines (Triton backend == torch backend; close to the full-precision cache)."""

from __future__ import annotations

import gc

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from roseinfer import LLM, SamplingParams  # noqa: E402
from roseinfer.config import CacheConfig  # noqa: E402
from roseinfer.kernels.kv_store import store_kv, store_kv_ref  # noqa: E402
from roseinfer.kernels.rotary import apply_rotary_and_store_kv, apply_rotary_ref  # noqa: E402
from roseinfer.kv import cache_dtype  # noqa: E402
from roseinfer.kv.cache_dtype import resolve_kv_cache_dtype, to_cache_dtype  # noqa: E402
from roseinfer.models.layers import RotaryEmbedding  # noqa: E402
from tests.kernels.kernel_utils import (  # noqa: E402
    DEVICE,
    DTYPE_IDS,
    FP8_DTYPES,
    assert_close,
    assert_fp8_close,
    generator,
    randn,
)
from tests.models.test_hf_parity import engine_prefill_logits, random_prompts  # noqa: E402
from tests.models.tiny_models import save_hf_model  # noqa: E402


def wide_values(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Values from 2^-22 (below fp8's subnormals) to past e4m3's range (448), both signs, some exact ties."""
    scale = torch.exp2(torch.randint(-22, 12, shape, generator=gen).float())
    x = torch.randn(shape, generator=gen) * scale
    x.view(-1)[:4] = torch.tensor([500.0, -1e5, 0.0, 0.65625])  # past both ranges; zero; an e4m3 tie
    return x.to(dtype).to(DEVICE)


@pytest.mark.parametrize("fp8", FP8_DTYPES, ids=DTYPE_IDS.get)
def test_to_cache_dtype_saturates_and_rounds_to_nearest_even(fp8: torch.dtype) -> None:
    top = torch.finfo(fp8).max
    x = torch.tensor([1e9, -1e9, top * 1.05, 0.0, float("nan")])
    got = to_cache_dtype(x, fp8).float()
    assert got[:4].tolist() == [top, -top, top, 0.0]
    assert torch.isnan(got[4])
    if fp8 == torch.float8_e4m3fn:  # 0.65625 lies halfway between 0.625 (even mantissa) and 0.6875
        assert to_cache_dtype(torch.tensor([0.65625, 0.71875]), fp8).float().tolist() == [0.625, 0.75]
    same = torch.randn(7, dtype=torch.bfloat16)
    assert torch.equal(to_cache_dtype(same, torch.bfloat16), same)


@pytest.mark.parametrize("fp8", FP8_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
def test_store_kv_fp8_matches_its_reference_exactly(fp8: torch.dtype, dtype: torch.dtype) -> None:
    gen = generator("store-fp8", fp8, dtype)
    num_blocks, block_size, heads, head_dim, tokens = 9, 16, 3, 80, 37
    k = wide_values((tokens, heads, head_dim), dtype, gen)
    v = wide_values((tokens, heads, head_dim), dtype, gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[::5] = -1  # padding rows
    slots = slots.to(DEVICE)
    kv = torch.zeros((num_blocks, 2, 2, block_size, heads, head_dim), dtype=fp8, device=DEVICE)
    ref = kv.clone()
    store_kv(k, v, kv[:, 1, 0], kv[:, 1, 1], slots)
    store_kv_ref(k, v, ref[:, 1, 0], ref[:, 1, 1], slots)
    assert torch.equal(kv.float(), ref.float())  # by value: the interpreter may write -0 as +0
    assert (kv.view(torch.uint8) != 0).sum() > 0.5 * 2 * (tokens - len(slots[::5])) * heads * head_dim
    assert not torch.isnan(kv.float()).any()


@pytest.mark.parametrize("fp8", FP8_DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_rotary_store_fp8(fp8: torch.dtype, dtype: torch.dtype) -> None:
    """The rotated k is rounded once from fp32 (the reference rounds the rotated `dtype` value: one fp8 step
    apart at most, now and then); v is stored exactly as `to_cache_dtype` has it; q is rotated in place."""
    gen = generator("rotary-fp8", fp8, dtype)
    tokens, q_heads, kv_heads, head_dim, block_size, num_blocks = 21, 4, 2, 64, 16, 4
    q = randn((tokens, q_heads, head_dim), dtype, gen)
    k = 4 * randn((tokens, kv_heads, head_dim), dtype, gen)
    v = randn((tokens, kv_heads, head_dim), dtype, gen)
    positions = torch.randint(0, 500, (tokens,), generator=gen).to(DEVICE)
    rot = RotaryEmbedding(head_dim, 512, 10000.0, None)
    rot.build(DEVICE)
    assert rot.cos_sin is not None
    q_ref, k_ref = apply_rotary_ref(q, k, positions, rot.cos_sin)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens].to(DEVICE)
    kv = torch.zeros((num_blocks, 1, 2, block_size, kv_heads, head_dim), dtype=fp8, device=DEVICE)
    k_cache, v_cache = kv[:, 0, 0], kv[:, 0, 1]
    apply_rotary_and_store_kv(q, k, v, positions, rot.cos_sin, k_cache, v_cache, slots)
    blk, off = slots // block_size, slots % block_size
    assert_fp8_close(k_cache[blk, off], k_ref)
    assert torch.equal(v_cache[blk, off].float(), to_cache_dtype(v, fp8).float())
    assert_close(q, q_ref, dtype)


def test_write_kernels_reject_a_cache_of_another_dtype() -> None:
    k = torch.zeros((2, 2, 16), dtype=torch.bfloat16, device=DEVICE)
    kv = torch.zeros((4, 16, 2, 16), dtype=torch.float16, device=DEVICE)
    slots = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="KV cache must be torch.bfloat16"):
        store_kv(k, k, kv, kv, slots)


def test_kv_cache_dtype_names() -> None:
    assert resolve_kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_cache_dtype("fp8", torch.bfloat16) == torch.float8_e4m3fn
    assert resolve_kv_cache_dtype("fp8_e4m3", torch.float16) == torch.float8_e4m3fn
    assert resolve_kv_cache_dtype("fp8_e5m2", torch.float32) == torch.float8_e5m2
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        CacheConfig(kv_cache_dtype="int8")


def test_fp8_cache_needs_sm89_with_triton(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "A100")
    cuda = torch.device("cuda", 0)
    with pytest.raises(ValueError, match="8.9 or newer; A100 is 8.0"):
        cache_dtype.check_fp8_cache_support(torch.float8_e4m3fn, cuda, "triton")
    cache_dtype.check_fp8_cache_support(torch.float8_e4m3fn, cuda, "torch")  # the torch backend runs it
    cache_dtype.check_fp8_cache_support(torch.bfloat16, cuda, "triton")


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # llama3 rope; q/k norm
def test_triton_backend_equals_torch_backend_with_fp8_cache(arch, tmp_path) -> None:
    """In float32 both backends read the same rounded K/V from an fp8 cache, so greedy output is the same
    token for token, through prefill chunks, decode steps and a prefix-cache hit; every block is returned."""
    model = save_hf_model(arch, tmp_path)
    prompts = random_prompts(model.config.vocab_size, seed=31, lengths=[1, 17, 40])
    prompts.append(prompts[2][:33] + [7, 8])  # shares two full blocks with prompt 2
    outs = {}
    for backend in ("torch", "triton"):
        llm = LLM(
            str(tmp_path),
            device=DEVICE.type,  # the Triton kernels run natively on a GPU, under the interpreter on a CPU
            dtype="float32",
            kv_cache_dtype="fp8",
            attention_backend=backend,
            num_kv_blocks=64,
            max_num_batched_tokens=32,  # prompt 2 prefills in two chunks
        )
        runner = llm.engine.core.runner
        assert runner.kv_cache.dtype == torch.float8_e4m3fn
        c = runner.cfg
        assert runner.block_bytes() == 16 * c.num_layers * 2 * c.num_kv_heads * c.head_dim  # 1 byte each
        outs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(6), use_tqdm=False)]
        kv = llm.engine.core.kv
        assert kv.num_hit_tokens > 0
        assert kv.num_free_blocks == kv.num_blocks
        del llm
        gc.collect()
    assert outs["triton"] == outs["torch"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: qkv bias, tied lm_head
def test_fp8_cache_logits_stay_close_to_the_full_precision_cache(arch, tmp_path) -> None:
    """An fp8 cache changes the logits (it is in use) but little: e4m3 (3 mantissa bits) less than e5m2 (2),
    the top token mostly the same. Figures here: e4m3 7-8% mean error against the logits' spread, e5m2 14%."""
    model = save_hf_model(arch, tmp_path)
    prompts = random_prompts(model.config.vocab_size, seed=3)
    logits = {}
    for name in ("auto", "fp8", "fp8_e5m2"):
        llm = LLM(str(tmp_path), device="cpu", dtype="float32", kv_cache_dtype=name, cpu_kv_tokens=2048)
        logits[name] = torch.cat([engine_prefill_logits(llm, p) for p in prompts])
        del llm
    full = logits["auto"]
    err = {n: ((logits[n] - full).abs().mean() / full.std()).item() for n in ("fp8", "fp8_e5m2")}
    top = {n: (logits[n].argmax(-1) == full.argmax(-1)).float().mean().item() for n in ("fp8", "fp8_e5m2")}
    assert 0.01 < err["fp8"] < 0.15, err
    assert err["fp8"] < err["fp8_e5m2"] < 0.3, err
    assert top["fp8"] >= 0.75 and top["fp8_e5m2"] >= 0.55, top


def test_attention_dots_take_fp16_for_bf16_queries_over_an_fp8_cache() -> None:
    """An fp8 cache's K/V widen to fp16 for bf16 queries (one conversion instruction a pair), under the
    interpreter too; other caches and other query types keep the queries' own type."""
    from roseinfer.kernels._common import attention_dot_dtype

    e4m3, e5m2, bf16 = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16
    assert attention_dot_dtype(bf16, e4m3) == torch.float16
    assert attention_dot_dtype(bf16, e5m2) == torch.float16
    assert attention_dot_dtype(bf16, bf16) == bf16
    assert attention_dot_dtype(torch.float16, e4m3) == torch.float16
    assert attention_dot_dtype(torch.float32, e4m3) == torch.float32
