"""The warp-specialised LONG_TILE kernel (`paged_prefill_ws.py`, Hopper) against the plain-torch reference,
through `paged_prefill_attention`'s dispatch. Every launch here is counted, so a test cannot pass on the Triton
kernel in its stead. The caches are `make_paged_cache`'s: block-major like the engine's, shuffled blocks, NaN
in every slot past a sequence's length (the last key tile's page tail, which the kernel must zero before PV)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from roseinfer.kernels import paged_prefill_ws  # noqa: E402
from roseinfer.kernels.paged_prefill_attention import (  # noqa: E402
    paged_prefill_attention,
    paged_prefill_attention_ref,
)
from roseinfer.kernels.prefill_plan import LONG_TILE  # noqa: E402
from tests.kernels.kernel_utils import (  # noqa: E402
    DEVICE,
    DTYPE_IDS,
    assert_close,
    generator,
    make_paged_cache,
    randn,
)
from tests.kernels.test_paged_prefill_attention import _run_tile_map  # noqa: E402

BLOCK_M = LONG_TILE[0]


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


hopper = pytest.mark.skipif(not _hopper(), reason="wgmma and TMA need a Hopper GPU")


@pytest.fixture
def ws_launches(monkeypatch) -> list[int]:
    """One entry per launch the warp-specialised kernel takes."""
    launches: list[int] = []
    run = paged_prefill_ws.paged_prefill_attention_ws

    def counted(*args, **kwargs):
        launches.append(1)
        return run(*args, **kwargs)

    monkeypatch.setattr(paged_prefill_ws, "paged_prefill_attention_ws", counted)
    return launches


def _run(
    q_lens: list[int],
    prefix_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    dtype: torch.dtype,
    block_size: int = 16,
    first_seq: int = 0,
    pad_rows: int = 3,
) -> None:
    gen = generator("prefill-ws", q_lens, prefix_lens, num_heads, num_kv_heads, dtype, block_size, first_seq)
    seq_lens = [p + n for p, n in zip(q_lens, prefix_lens, strict=True)]
    cache = make_paged_cache(seq_lens, block_size, num_kv_heads, 128, dtype, gen)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    qsl = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    q = randn((starts[-1] + pad_rows, num_heads, 128), dtype, gen)
    args = (cache.k_cache, cache.v_cache, cache.block_tables, qsl, cache.seq_lens, max(q_lens), 128**-0.5)
    out = torch.full_like(q, float("nan"))
    paged_prefill_attention(q, *args, out=out, block_m=BLOCK_M, first_seq=first_seq)
    ref = paged_prefill_attention_ref(q, *args)
    begin, end = starts[first_seq], starts[-1]
    assert torch.isnan(out[:begin]).all(), "rows of sequences before first_seq were written"
    assert torch.isnan(out[end:]).all(), "rows outside every sequence were written"
    assert_close(out[begin:end], ref[begin:end], dtype)


# Chunks of 1, 127-129 and 1000+ tokens, fresh and over prefixes that end at, before and past key-tile and page
# edges; the longest sequence's key tiles number 2 (the loop's shortest) to 47.
Q_LENS = [1000, 1, 257, 128, 129, 127, 513, 2048, 130]
PREFIX_LENS = [0, 700, 300, 1024, 0, 1, 17, 4101, 126]


@hopper
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads"), [(32, 8), (16, 16), (8, 1), (28, 4)], ids=["llama8b", "mha", "mqa", "gqa7"]
)
@pytest.mark.parametrize("block_size", [16, 32, 64, 128], ids=lambda b: f"bs{b}")
def test_ws_matches_reference_gpu(
    ws_launches, dtype: torch.dtype, num_heads: int, num_kv_heads: int, block_size: int
) -> None:
    _run(Q_LENS, PREFIX_LENS, num_heads, num_kv_heads, dtype, block_size)
    assert len(ws_launches) == 1


@hopper
@pytest.mark.gpu
@pytest.mark.parametrize("first_seq", [1, 3])
def test_ws_first_seq_leaves_earlier_sequences_alone_gpu(ws_launches, first_seq: int) -> None:
    _run([1, 1, 1, 300, 129], [40, 17, 200, 2000, 0], 32, 8, torch.bfloat16, first_seq=first_seq)
    assert len(ws_launches) == 1


@hopper
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
def test_ws_tile_map_matches_reference_gpu(ws_launches, dtype: torch.dtype) -> None:
    """An eager step's LONG_TILE map that cuts no key: decodes first (left to the decode kernel), spare
    programs at the end, rows past the last sequence untouched."""
    q_lens = [1, 1, 1024, 129, 1015, 3]
    prefix_lens = [30, 900, 9216, 0, 2048, 4000]
    tiles = _run_tile_map(q_lens, prefix_lens, 32, 8, 128, dtype, BLOCK_M, 2, spare=9, pad_rows=4)
    assert (tiles[3] <= 1).all() and len(ws_launches) == 1


@hopper
@pytest.mark.gpu
def test_ws_declines_what_it_cannot_run_gpu(ws_launches) -> None:
    """Other tiles, cut keys, fp8 caches, D=64, fp32 and 8-slot pages take the Triton kernel, and still match."""
    gen = generator("prefill-ws-declines")
    q = randn((300, 8, 128), torch.bfloat16, gen)
    cache = make_paged_cache([300], 16, 2, 128, torch.bfloat16, gen)
    k, v = cache.k_cache, cache.v_cache
    assert paged_prefill_ws.takes_launch(q, k, v, BLOCK_M, None, cuts_keys=False)
    assert not paged_prefill_ws.takes_launch(q, k, v, 64, None, cuts_keys=False)
    assert not paged_prefill_ws.takes_launch(q, k, v, BLOCK_M, 64, cuts_keys=False)
    assert not paged_prefill_ws.takes_launch(q, k, v, BLOCK_M, None, cuts_keys=True)
    fp8 = k.to(torch.float8_e4m3fn)
    assert not paged_prefill_ws.takes_launch(q, fp8, fp8, BLOCK_M, None, cuts_keys=False)
    assert not paged_prefill_ws.takes_launch(q.float(), k.float(), v.float(), BLOCK_M, None, cuts_keys=False)
    small = make_paged_cache([300], 16, 2, 64, torch.bfloat16, gen)
    assert not paged_prefill_ws.takes_launch(q[..., :64], small.k_cache, small.v_cache, BLOCK_M, None, False)
    pages8 = make_paged_cache([300], 8, 2, 128, torch.bfloat16, gen)
    assert not paged_prefill_ws.takes_launch(q, pages8.k_cache, pages8.v_cache, BLOCK_M, None, False)
    _run([300, 77], [1000, 3], 8, 2, torch.bfloat16, block_size=8)
    assert ws_launches == []


def test_ws_never_takes_a_cpu_launch() -> None:
    gen = generator("prefill-ws-cpu")
    q = randn((4, 2, 128), torch.bfloat16, gen).cpu()
    cache = make_paged_cache([4], 16, 1, 128, torch.bfloat16, gen)
    k, v = cache.k_cache.cpu(), cache.v_cache.cpu()
    assert not paged_prefill_ws.takes_launch(q, k, v, BLOCK_M, None, cuts_keys=False)


def test_runs_on_hopper_at_d128_in_half_precision_with_pages_that_divide_the_key_tile(monkeypatch) -> None:
    """The device-level half of `takes_launch`, which the mixed-step graphs ask before capturing LONG_TILE twins."""
    hopper = {"yes": True}
    monkeypatch.setattr(paged_prefill_ws, "_is_hopper", lambda index: hopper["yes"])
    monkeypatch.setattr(paged_prefill_ws, "is_interpret", lambda: False)
    cuda, bf16, fp16 = torch.device("cuda", 0), torch.bfloat16, torch.float16

    def runs(device=cuda, dtype=bf16, cache=bf16, head_dim=128, block_size=16) -> bool:
        return paged_prefill_ws.runs_on(device, dtype, cache, head_dim, block_size)

    assert all(runs(block_size=b) for b in (16, 32, 64, 128)) and runs(dtype=fp16, cache=fp16)
    assert not any(runs(block_size=b) for b in (1, 8, 48, 256))
    assert not runs(cache=torch.float8_e4m3fn) and not runs(dtype=torch.float32, cache=torch.float32)
    assert not runs(cache=fp16) and not runs(head_dim=64) and not runs(device=torch.device("cpu"))
    monkeypatch.setattr(paged_prefill_ws, "ENABLED", False)
    assert not runs()
    monkeypatch.setattr(paged_prefill_ws, "ENABLED", True)
    hopper["yes"] = False
    assert not runs()
    hopper["yes"] = True
    monkeypatch.setattr(paged_prefill_ws, "is_interpret", lambda: True)
    assert not runs()


COMPILE_FOR_SM90 = """
import json
from triton.backends.compiler import GPUTarget
from triton.compiler import compile as triton_compile
from triton.experimental.gluon._runtime import GluonASTSource
from roseinfer.kernels import paged_prefill_ws as ws

constants = ws.launch_constants(32, 8, tile_map=True)
json.dumps(constants)  # what Triton's compile hooks do with them
box = f"tensordesc<bf16[1, 16, {ws.SWIZZLE_COLS}],{ws.BOX_LAYOUT.value!r}>"
types = ["*bf16", box, box, "*i32", "*i32", "*i32", "*bf16", "*i32", "fp32"] + ["i32"] * 8
names = ws._prefill_ws_kernel.arg_names
signature = dict(zip(names, types + ["constexpr"] * (len(names) - len(types)), strict=True))
aligned = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(types) if t.startswith("*")}
source = GluonASTSource(ws._prefill_ws_kernel, signature, constexprs=constants, attrs=aligned)
compiled = triton_compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
ptx = compiled.asm["ptx"]
print(json.dumps({
    "warps": compiled.metadata.num_warps,
    "shared": compiled.metadata.shared,
    "found": [op for op in ("setmaxnreg", "cp.async.bulk.tensor", "wgmma.mma_async") if op in ptx],
}))
"""


def test_ws_kernel_compiles_for_hopper_from_plain_constants() -> None:
    """No GPU needed: the kernel compiles for sm_90 from the launcher's own constants (a loader and two consumer
    partitions, TMA copies, async wgmma, within an H100's shared memory), and those constants are what Triton's
    compile hooks can serialise (a layout object among them failed the engine's compile watch). In a process of
    its own: under TRITON_INTERPRET the kernels are the interpreter's, which do not compile."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_SM90], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["found"] == ["setmaxnreg", "cp.async.bulk.tensor", "wgmma.mma_async"]
    assert result["warps"] == 12  # 4 + 4 + 1, rounded up to warp groups
    assert 0 < result["shared"] <= 227 * 1024
