"""paged_decode_attention with `live`: the launch of a mixed-step CUDA graph, whose grid is fixed at capture
while its step's decodes are not. Rows order[0..live) are served, each cut into as many splits as the GPU picks
from `live`; the rest get zero outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from roseinfer.kernels import paged_decode_split as launch  # noqa: E402
from roseinfer.kernels.decode_new_token import NewTokenKV  # noqa: E402
from roseinfer.kernels.paged_decode_attention import (  # noqa: E402
    paged_decode_attention,
    paged_decode_attention_ref,
)
from roseinfer.kernels.paged_decode_split import choose_num_splits, decode_order, live_counters  # noqa: E402
from tests.kernels.kernel_utils import (  # noqa: E402
    DEVICE,
    DTYPE_IDS,
    assert_close,
    generator,
    make_paged_cache,
    randn,
)


def expected_splits(rows: int, live: int, num_kv_heads: int, longest: int) -> int:
    """What an eager launch of the `live` decodes would take (`choose_num_splits`), within the launch's rows."""
    if live == 0:
        return 1
    return min(choose_num_splits(live, num_kv_heads, longest, DEVICE), rows // live)


def run_live(
    monkeypatch: pytest.MonkeyPatch,
    decode_lens: list[int],
    rows: int,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    target: int | None,
) -> None:
    """The step's decodes (`decode_lens`, in row order) in a launch of `rows` rows, served longest first as a
    graph orders them; the launch aims at `target` programs. Checks the served rows against the reference,
    the others for zeros, and which partials were written: exactly the live rows' expected splits. `target`
    None: the device's own."""
    live = len(decode_lens)
    gen = generator(
        "decode-live", decode_lens, rows, block_size, num_heads, num_kv_heads, head_dim, dtype, target
    )
    seq_lens = decode_lens + [0] * (rows - live)
    cache = make_paged_cache(seq_lens, block_size, num_kv_heads, head_dim, dtype, gen)
    q = randn((rows, num_heads, head_dim), dtype, gen)
    order = np.concatenate([decode_order(np.array(decode_lens, np.int32)), np.arange(live, rows)])
    workspaces = []
    shipped = launch.split_workspace

    def nan_workspace(*args, **kwargs):
        part = shipped(*args, **kwargs)
        for t in part[:3]:
            t.fill_(float("nan"))
        workspaces.append(part)
        return part

    if target is not None:
        monkeypatch.setattr(launch, "target_programs", lambda device: target)
    monkeypatch.setattr(launch, "split_workspace", nan_workspace)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(
        q,
        cache.k_cache,
        cache.v_cache,
        cache.block_tables,
        cache.seq_lens,
        head_dim**-0.5,
        out=out,
        order=torch.from_numpy(order.astype(np.int32)).to(DEVICE),
        live=torch.tensor([live], dtype=torch.int32, device=DEVICE),
    )
    ref = paged_decode_attention_ref(
        q[:live], cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, head_dim**-0.5
    )
    assert_close(out[:live], ref, dtype)
    assert torch.equal(out[live:], torch.zeros_like(out[live:]))

    splits = expected_splits(rows, live, num_kv_heads, max(decode_lens, default=0))
    (part_m, _, _, _) = workspaces[0]
    written = int((~part_m.isnan()).sum())
    assert written == (live * num_heads * splits if splits > 1 else 0), (written, splits)
    counters = live_counters(DEVICE)
    assert counters is not None and not counters.any()  # every merge gave its ticket counter back


# Decodes of 0-1,300 keys (block boundaries, odd lengths), served by launches of 1-32 rows: one decode alone
# (all the rows' slots its splits), a few (the slots shared), as many as the rows (no split), none.
@pytest.mark.parametrize(
    ("decode_lens", "rows"),
    [
        ([1300], 32),
        ([1300], 1),
        ([700, 33, 1300], 16),
        ([17, 1, 0, 256, 257], 8),
        ([40, 300, 65, 500], 4),
        ([], 8),
    ],
    ids=["one-long", "one-row", "three", "five-short", "full", "none"],
)
@pytest.mark.parametrize("target", [8, 64])
def test_live_rows_split_on_the_gpu(monkeypatch, decode_lens: list[int], rows: int, target: int) -> None:
    run_live(monkeypatch, decode_lens, rows, 16, 8, 2, 64, torch.float32, target)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(("block_size", "head_dim", "num_heads"), [(1, 128, 4), (64, 64, 14), (16, 80, 2)])
def test_live_rows_dtypes_and_shapes(
    monkeypatch, dtype: torch.dtype, block_size: int, head_dim: int, num_heads: int
):
    run_live(monkeypatch, [513, 90, 1], 12, block_size, num_heads, 2, head_dim, dtype, 64)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "decode_lens", [[10240], [4100, 9000, 333], [2000] * 40], ids=["w7", "three", "forty"]
)
def test_live_rows_at_llama_shape(monkeypatch, decode_lens: list[int]) -> None:
    """A 1,024-token mixed graph's 256 rows at llama-3.1-8b's heads: W7's lone 10k-key decode beside a chunk
    (32 splits on an H100/H200), a few long ones, and enough to fill the GPU unsplit."""
    if DEVICE.type != "cuda":
        pytest.skip("needs a CUDA GPU")
    run_live(monkeypatch, decode_lens, 256, 16, 32, 8, 128, torch.bfloat16, None)


def test_live_needs_an_order_and_no_new_token() -> None:
    cache = make_paged_cache([3, 4], 16, 2, 64, torch.float32, generator("decode-live-bad"))
    q = torch.zeros((2, 4, 64), device=DEVICE)
    live = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    order = torch.arange(2, dtype=torch.int32, device=DEVICE)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 1.0)
    new_kv = NewTokenKV(
        torch.zeros((2, 2, 64), device=DEVICE), torch.zeros((2, 2, 64), device=DEVICE), cache.seq_lens
    )
    for kwargs in ({}, {"order": order, "new_kv": new_kv}, {"order": order, "live": live.long()}):
        with pytest.raises(ValueError, match="`live`"):
            paged_decode_attention(*args, **{"live": live, **kwargs})


# Runs in a process of its own, off the interpreter: each launch below, as `paged_decode_attention` makes it on
# CPU tensors (the recorder stands in for its launcher), compiled for sm_90 with the argument types it passed.
COMPILE_LAUNCHES_FOR_SM90 = """
import json
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as triton_compile
from roseinfer.kernels import paged_decode_attention as pda
from roseinfer.kernels.decode_new_token import NewTokenKV

kernel, launches = pda._decode_kernel, []

class Recorder:
    def run(self, grid, args, constexprs):
        launches.append((args, dict(constexprs)))

pda.launcher = Recorder()
types = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32", torch.int64: "*i64"}
rows, heads, kv_heads, dim = 8, 32, 8, 128
q = torch.zeros((rows, heads, dim), dtype=torch.bfloat16)
cache = torch.zeros((4, 16, kv_heads, dim), dtype=torch.bfloat16)
tables = torch.zeros((rows, 4), dtype=torch.int32)
lens = torch.full((rows,), 40, dtype=torch.int32)
order = torch.arange(rows, dtype=torch.int32)
rope = (torch.zeros(rows, dtype=torch.int64), torch.zeros((64, dim), dtype=torch.float32))
new = NewTokenKV(torch.zeros((rows, kv_heads, dim), dtype=torch.bfloat16), torch.zeros_like(q[:, :kv_heads]), lens, rope)
for kwargs in ({"num_splits": 1, "new_kv": new}, {"num_splits": 3, "new_kv": new}, {"num_splits": 4, "order": order},
               {"order": order, "live": torch.ones(1, dtype=torch.int32)}):
    pda.paged_decode_attention(q, cache, cache, tables, lens, 1.0, **kwargs)
ptx = []
for args, kwargs in launches:
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "maxnreg", "launch_pdl") if k in kwargs}
    options.pop("launch_pdl", None)
    names = kernel.arg_names
    signature, attrs = {}, {}
    for i, (name, value) in enumerate(zip(names, args)):
        if isinstance(value, torch.Tensor):
            signature[name] = types[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if isinstance(value, float) else "i32"
    constants = {(names.index(k),): v for k, v in kwargs.items()}
    signature.update({k: "constexpr" for k in kwargs})
    source = ASTSource(kernel, signature, constants, attrs)
    ptx.append(triton_compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"])
print(json.dumps({"merges": ["atom.global" in p for p in ptx]}))
"""


def test_decode_launches_compile_for_hopper() -> None:
    """No GPU needed: the launches the engine makes (a decode graph's, unsplit and split, with its own token and
    rotary; an eager mixed step's, split; a mixed-step graph's, split on the GPU) compile for sm_90 from the
    argument types the launcher passes, and only the split ones hold the merge's atomics. (Unsplit, the launcher
    passes `out` for the unused counters: a merge compiled into that variant failed on an H200.)"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", COMPILE_LAUNCHES_FOR_SM90],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"merges": [False, True, True, True]}
