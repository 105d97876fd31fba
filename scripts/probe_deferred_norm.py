# ruff: noqa: B023  (the closures are timed right where they are made)
"""The go/no-go probe for folded norms (GPU): a layer stack's linears at batch B, with and without the
two RMSNorm launches per layer, as CUDA graphs.

A: norm(+res), qkv(+bias), o, norm(+res), gate_up, SiLU, down      (the decode path before 6th session)
B: qkv on the raw residual, o as addmm into the residual, gate_up, SiLU, down as addmm (norms deferred)
Attention is left out of both. GPU only.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from roseinfer.bench.kernels import _graph_median_ms, _paged_cache
from roseinfer.config import ModelConfig
from roseinfer.kernels.activation import silu_and_mul
from roseinfer.kernels.rmsnorm import rmsnorm


def linears() -> None:
    dev, dt = torch.device("cuda"), torch.bfloat16
    for shape, batch in (("qwen2.5-0.5b", 64), ("qwen2.5-0.5b", 256), ("llama-3.1-8b", 64)):
        cfg = ModelConfig.from_path(f"roseinfer/models/configs/{shape}.json")
        h, i = cfg.hidden_size, cfg.intermediate_size
        q = cfg.num_heads * cfg.head_dim
        qkv = q + 2 * cfg.num_kv_heads * cfg.head_dim
        layers = cfg.num_layers

        def rnd(*s: int) -> torch.Tensor:
            return torch.randn(*s, device=dev, dtype=dt) / s[-1] ** 0.5

        W = [
            dict(qkv=rnd(qkv, h), b=rnd(qkv) if cfg.qkv_bias else None, o=rnd(h, q), gu=rnd(2 * i, h),
                 d=rnd(h, i), ln1=1 + rnd(h), ln2=1 + rnd(h))
            for _ in range(layers)
        ]  # fmt: skip
        x0 = rnd(batch, h)
        attn = rnd(batch, q)

        def a(W=W, x0=x0, attn=attn) -> None:
            x, res = x0, x0.clone()
            for L in W:
                n = rmsnorm(x, L["ln1"], 1e-6, res)
                F.linear(n, L["qkv"], L["b"])
                x = F.linear(attn, L["o"])
                n = rmsnorm(x, L["ln2"], 1e-6, res)
                x = F.linear(silu_and_mul(F.linear(n, L["gu"])), L["d"])

        def b(W=W, x0=x0, attn=attn) -> None:
            hid = x0.clone()
            for L in W:
                torch.mm(hid, L["qkv"].t())
                hid = torch.addmm(hid, attn, L["o"].t())
                hid = torch.addmm(hid, silu_and_mul(torch.mm(hid, L["gu"].t())), L["d"].t())

        def b_inplace(W=W, x0=x0, attn=attn) -> None:
            hid = x0.clone()
            for L in W:
                torch.mm(hid, L["qkv"].t())
                hid.addmm_(attn, L["o"].t())
                hid.addmm_(silu_and_mul(torch.mm(hid, L["gu"].t())), L["d"].t())

        ta, tb, tc = (_graph_median_ms(f) * 1e3 / layers for f in (a, b, b_inplace))
        print(f"{shape} b={batch}: today {ta:.2f} us/layer, deferred {tb:.2f} (in place {tc:.2f}): "
              f"{ta - tb:+.2f} us/layer, {(ta - tb) * layers:.0f} us/step", flush=True)  # fmt: skip


def kernels() -> None:
    """The two kernels that take over the norm's work, with and without it (batch 64, context 1k)."""
    from roseinfer.kernels.decode_new_token import DeferredNorm, NewTokenKV
    from roseinfer.kernels.paged_decode_attention import _decode_kernel, paged_decode_attention
    from roseinfer.kernels.paged_decode_split import choose_num_splits
    from roseinfer.models.layers import RotaryEmbedding

    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    import roseinfer.kernels.paged_decode_split as launch

    variants = [("qwen2.5-0.5b", None, 4, 64), ("llama-3.1-8b", None, 4, 64)]
    variants += [("llama-3.1-8b", None, 4, 256), ("llama-3.1-8b", 128, 4, 256), ("llama-3.1-8b", 112, 4, 256)]
    real_config = launch.decode_config
    for shape, maxnreg, warps, batch in variants:
        launch.launch_options = lambda d, dt, norm, r=maxnreg: {"maxnreg": r} if norm and r else {}
        launch.decode_config = lambda d, dt, w=warps: (*real_config(d, dt)[:1], w, real_config(d, dt)[2])
        cfg = ModelConfig.from_path(f"roseinfer/models/configs/{shape}.json")
        ctx, bs = 1024, 16
        hq, hk, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        _, kc, vc, tables = _paged_cache(batch, ctx, bs, hk, d, dt, gen)
        lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
        qkv = torch.randn(batch, (hq + 2 * hk) * d, device=dev, dtype=dt)
        q = qkv[:, : hq * d].view(batch, hq, d)
        k = qkv[:, hq * d : (hq + hk) * d].view(batch, hk, d)
        v = qkv[:, (hq + hk) * d :].view(batch, hk, d)
        rot = RotaryEmbedding(d, ctx + 1, cfg.rope_theta, None)
        rot.build(dev)
        rope = (lens - 1, rot.cos_sin)
        x = torch.randn(batch, cfg.hidden_size, device=dev, dtype=dt)
        bias = torch.randn(qkv.shape[1], device=dev, dtype=dt) if cfg.qkv_bias else None
        slots = torch.full((batch,), -1, dtype=torch.int32, device=dev)
        splits = choose_num_splits(batch, hk, ctx, dev)
        out = torch.empty_like(q)
        times = []
        for norm in (None, DeferredNorm(x, 1e-6, bias)):
            nk = NewTokenKV(k, v, slots, rope, norm)
            times.append(_graph_median_ms(
                lambda nk=nk: paged_decode_attention(q, kc, vc, tables, lens, d**-0.5, out=out, num_splits=splits, new_kv=nk)
            ) * 1e3)  # fmt: skip
        gu = torch.randn(batch, 2 * cfg.intermediate_size, device=dev, dtype=dt)
        silu = [_graph_median_ms(lambda r=r: silu_and_mul(gu, r, 1e-6)) * 1e3 for r in (None, x)]
        print(f"{shape} b={batch} ctx={ctx} splits={splits} maxnreg {maxnreg} warps {warps}: attention {times[0]:.2f} -> {times[1]:.2f} us, "
              f"SiLU {silu[0]:.2f} -> {silu[1]:.2f} us (without -> with the deferred norm)", flush=True)  # fmt: skip

    for kernels_ in _decode_kernel.device_caches.values():
        for k in kernels_[0].values():
            print(f"_decode_kernel variant: {k.n_regs} registers, {k.n_spills} spills", flush=True)


def agreement() -> None:
    """bf16 greedy tokens of the tiny models against HF in float32: torch backend, Triton with and without
    folded norms (how often each agrees on the first 4 tokens)."""
    import tempfile

    from roseinfer import LLM, SamplingParams
    from tests.models.test_hf_parity import hf_greedy, random_prompts
    from tests.models.tiny_models import TINY_CONFIGS, save_hf_model

    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for arch in sorted(TINY_CONFIGS):
        with tempfile.TemporaryDirectory() as tmp:
            model = save_hf_model(arch, tmp)
            prompts = random_prompts(model.config.vocab_size, seed=11) + random_prompts(
                model.config.vocab_size, seed=12
            )
            want = [hf_greedy(model, p, 4) for p in prompts]
            row = []
            for backend, fold in (("torch", False), ("triton", False), ("triton", True)):
                llm = LLM(tmp, device="cuda", dtype="bfloat16", block_size=16, num_kv_blocks=256, max_num_seqs=32,
                          attention_backend=backend, fold_norms=fold)  # fmt: skip
                got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
                row.append(
                    f"{backend}{'+fold' if fold else ''} {sum(g == w for g, w in zip(got, want))}/{len(want)}"
                )
                del llm
            print(f"{arch}: " + ", ".join(row), flush=True)


def silu_blocks() -> None:
    """SiLU with the deferred norm: column tiles per program (each program reads its row of x once)."""
    import roseinfer.kernels.activation as act

    dev, dt = torch.device("cuda"), torch.bfloat16
    for shape in ("qwen2.5-0.5b", "llama-3.1-8b"):
        cfg = ModelConfig.from_path(f"roseinfer/models/configs/{shape}.json")
        for batch in (64, 256):
            x = torch.randn(batch, cfg.hidden_size, device=dev, dtype=dt)
            gu = torch.randn(batch, 2 * cfg.intermediate_size, device=dev, dtype=dt)
            act._config = lambda n, r_cols: (1024, 4)
            cells = [f"plain {_graph_median_ms(lambda: silu_and_mul(gu)) * 1e3:.2f}"]
            for block, warps in ((1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16)):
                act._config = lambda n, r_cols, c=(block, warps): c
                cells.append(
                    f"{block}/{warps} {_graph_median_ms(lambda: silu_and_mul(gu, x, 1e-6)) * 1e3:.2f}"
                )
            print(f"SiLU {shape} b={batch} (us): " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    for section in sys.argv[1:] or ["linears"]:
        {"linears": linears, "kernels": kernels, "agreement": agreement, "silu": silu_blocks}[section]()
    print(torch.cuda.get_device_name(), file=sys.stderr)
