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

from roseinfer.bench.kernels import _graph_median_ms
from roseinfer.config import ModelConfig
from roseinfer.kernels.activation import silu_and_mul
from roseinfer.kernels.rmsnorm import rmsnorm


def main() -> None:
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
    print(torch.cuda.get_device_name(), file=sys.stderr)


if __name__ == "__main__":
    main()
