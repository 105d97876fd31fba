"""`DirectLaunch.run`, the keyed launch of every kernel a step launches from Python: those an eager step runs a layer
at a time (prefill and decode attention, rotary with the KV store, RMSNorm, SiLU-and-mul, q/k norm), the decode
chain's GEMV and skinny GEMM (eager where graphs are off), the KV store, block copy, the pending-id scatter and the
samplers. No GPU needed: Triton's own binder, built for sm_90, says what each launch would specialise on, and a
stand-in for the compiled variant records what the direct path hands its launcher."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

from roseinfer.kernels import (  # noqa: E402
    activation,
    block_copy,
    direct_launch,
    gemv,
    kv_store,
    logits_sample,
    paged_decode_attention,
    paged_prefill_attention,
    pending_ids,
    qk_norm,
    rmsnorm,
    rotary,
    sampling,
    skinny_gemm,
)
from tests.kernels.test_direct_launch import FakeKernel  # noqa: E402

BACKEND = make_backend(GPUTarget("cuda", 90, 32))


def jitted(kernel) -> JITFunction:
    """The kernel as Triton compiles it (under TRITON_INTERPRET, `triton.jit` gives an interpreted function)."""
    return kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn, **kernel.kwargs)


def binder(kernel):
    """Triton's argument binder for `kernel` on sm_90: (bound arguments, specialisation, options)."""
    kernel = jitted(kernel)
    return create_function_from_signature(kernel.signature, kernel.params, BACKEND)


class Recorder(direct_launch.DirectLaunch):
    """A module's launcher that keeps each launch's key and arguments instead of launching."""

    def __init__(self, kernel) -> None:
        super().__init__(kernel)
        self.calls: list[tuple] = []

    def __call__(self, key, grid, args, constexprs, jit_args=None) -> None:
        self.calls.append((key, tuple(grid), tuple(args), dict(constexprs)))


def paged_inputs(rng: random.Random, heads: int, kv_heads: int, dtype=torch.float16):
    """A small paged prefill or decode batch on CPU tensors: q, the caches, tables, lengths, starts."""
    seqs, block_size = rng.randint(1, 4), rng.choice([16, 32])
    lens = [rng.randint(1, 90) for _ in range(seqs)]
    new = [rng.randint(1, n) for n in lens]
    tokens = sum(new)
    q = torch.randn(tokens, heads, 64, dtype=dtype)
    cache = torch.zeros(24, 2, block_size, kv_heads, 64, dtype=dtype)
    tables = torch.zeros(seqs, rng.randint(6, 20), dtype=torch.int32)
    starts = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    return q, cache[:, 0], cache[:, 1], tables, starts, torch.tensor(lens, dtype=torch.int32), max(new)


def rmsnorm_call(rng: random.Random) -> None:
    rows, cols = rng.randint(1, 40), rng.choice([64, 96, 200])
    x = torch.randn(rows, cols + rng.choice([0, 3]))[:, :cols]
    residual = torch.randn(rows, cols) if rng.random() < 0.5 else None
    rmsnorm.rmsnorm(x, torch.ones(cols), 1e-6, residual=residual)


def silu_call(rng: random.Random) -> None:
    rows, cols = rng.randint(1, 40), rng.choice([32, 48, 128])
    x = torch.randn(rows, 2 * cols)
    rms_of = torch.randn(rows + 2, rng.choice([64, 4096])) if rng.random() < 0.5 else None
    activation.silu_and_mul(x, rms_of=rms_of, eps=1e-6)


def qk_norm_call(rng: random.Random) -> None:
    heads, kv_heads, dim = rng.choice([(4, 2, 64), (16, 8, 128), (7, 1, 64)])
    qkv = torch.randn(rng.randint(1, 30), (heads + 2 * kv_heads) * dim + rng.choice([0, 8]))
    qk_norm.qk_norm_(qkv, heads, kv_heads, dim, torch.ones(dim), torch.ones(dim), 1e-6)


def rotary_call(rng: random.Random) -> None:
    heads, kv_heads = rng.choice([(4, 2), (14, 2), (1, 1)])
    tokens, dim = rng.randint(1, 30), 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim + rng.choice([0, 4]))
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim : (heads + 2 * kv_heads) * dim].view(tokens, kv_heads, dim)
    positions, cos_sin = torch.arange(tokens), torch.zeros(tokens + 1, dim)
    if rng.random() < 0.3:
        rotary.apply_rotary(q, k, positions, cos_sin)
        return
    cache = torch.zeros(8, 2, rng.choice([16, 32]), kv_heads, dim)
    rotary.apply_rotary_and_store_kv(
        q, k, v, positions, cos_sin, cache[:, 0], cache[:, 1], torch.arange(tokens)
    )


def prefill_call(rng: random.Random) -> None:
    q, k, v, tables, starts, lens, longest = paged_inputs(rng, *rng.choice([(4, 2), (14, 2), (8, 8)]))
    first = rng.randint(0, lens.shape[0] - 1)
    paged_prefill_attention.paged_prefill_attention(
        q, k, v, tables, starts, lens, longest, 0.125, first_seq=first
    )


def decode_call(rng: random.Random) -> None:
    q, k, v, tables, _, lens, _ = paged_inputs(rng, *rng.choice([(4, 2), (14, 2), (8, 8)]))
    batch = lens.shape[0]
    splits = rng.choice([1, 2, 5, 16])
    paged_decode_attention.paged_decode_attention(q[:batch], k, v, tables, lens, 0.125, num_splits=splits)


def gemv_call(rng: random.Random) -> None:
    m, k, n = rng.randint(1, 3), rng.choice([32, 48, 100]), rng.choice([16, 24, 40])
    gated, x = rng.random() < 0.5, torch.randn(m, k)
    weight = torch.randn(2 * n if gated else n, k)
    gemv.gemv(
        x, weight, gated=gated,
        bias=torch.randn(weight.shape[0]) if rng.random() < 0.5 else None,
        norm_weight=torch.ones(k) if rng.random() < 0.5 else None,
        residual=torch.randn(m, n) if rng.random() < 0.5 else None,
    )  # fmt: skip


def skinny_call(rng: random.Random) -> None:
    m, k, n = rng.randint(1, 64), rng.choice([96, 200]), rng.choice([16, 40, 64])
    x, w = torch.randn(m, k), torch.randn(n, k)
    tile = skinny_gemm.GemmTile(16, 32, rng.choice([1, 2, 3]))  # split > 1 launches the sum too
    out = torch.randn(m, n) if rng.random() < 0.5 else None
    skinny_gemm.skinny_gemm(x, w, out=out, add=out is not None, pdl=rng.random() < 0.5, tile=tile)


def kv_store_call(rng: random.Random) -> None:
    tokens, kv_heads, dim = rng.randint(1, 30), rng.choice([1, 2, 8]), rng.choice([64, 128])
    k, v = torch.randn(tokens, kv_heads, dim), torch.randn(tokens, kv_heads, dim)
    cache = torch.zeros(8, 2, rng.choice([16, 32]), kv_heads, dim)
    slots = torch.randperm(8 * cache.shape[2])[:tokens].to(rng.choice([torch.int32, torch.int64]))
    kv_store.store_kv(k, v, cache[:, 0], cache[:, 1], slots)


def block_copy_call(rng: random.Random) -> None:
    cache = torch.zeros(12, 2, rng.choice([16, 32]), rng.choice([1, 4]), 64)
    pairs = torch.randperm(12)[: 2 * rng.randint(1, 6)].view(2, -1)
    block_copy.copy_blocks(cache, pairs[0].clone(), pairs[1].clone())


def pending_call(rng: random.Random) -> None:
    n, rows = rng.randint(1, 40), rng.randint(1, 20)
    ids = torch.zeros(n + rng.randint(0, 30), dtype=rng.choice([torch.int32, torch.int64]))
    fill_index = torch.randperm(ids.shape[0])[:n].to(torch.int32)
    pending_ids.scatter_pending(ids, fill_index, torch.randint(0, rows, (n,), dtype=torch.int32),
                                torch.randint(0, 100, (rows,)))  # fmt: skip


def sampled(rng: random.Random, rows: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(temperature, seeds) for `rows` rows, or (None, None): every row greedy."""
    if rng.random() < 0.5:
        return None, None
    return torch.rand(rows), torch.randint(0, 2**40, (rows,))


def sample_call(rng: random.Random) -> None:
    rows, vocab = rng.randint(1, 20), rng.choice([50, 256, 1000])
    sampling.sample_tokens(torch.randn(rows, vocab), *sampled(rng, rows))


def logits_sample_call(rng: random.Random) -> None:
    m, k, vocab = rng.randint(1, 20), rng.choice([32, 64]), rng.choice([40, 100])
    tokens = torch.zeros(m, dtype=rng.choice([torch.int32, torch.int64]))
    temperature, seeds = sampled(rng, m)
    logits_sample.logits_and_sample(
        torch.randn(m, k), torch.randn(vocab, k), temperature, seeds, tokens, pdl=rng.random() < 0.5
    )


# (module, launcher attribute): a call of the wrapper that launches through it.
LAUNCHES = {
    (rmsnorm, "launcher"): rmsnorm_call,
    (activation, "launcher"): silu_call,
    (qk_norm, "launcher"): qk_norm_call,
    (rotary, "launcher"): rotary_call,
    (paged_prefill_attention, "launcher"): prefill_call,
    (paged_decode_attention, "launcher"): decode_call,
    (gemv, "launcher"): gemv_call,
    (skinny_gemm, "launcher"): skinny_call,
    (skinny_gemm, "sum_launcher"): skinny_call,
    (kv_store, "launcher"): kv_store_call,
    (block_copy, "launcher"): block_copy_call,
    (pending_ids, "launcher"): pending_call,
    (sampling, "chunk_launcher"): sample_call,
    (sampling, "pick_launcher"): sample_call,
    (logits_sample, "launcher"): logits_sample_call,
    (logits_sample, "pick_launcher"): logits_sample_call,
}
IDS = [f"{module.__name__.rsplit('.', 1)[1]}.{name}" for module, name in LAUNCHES]

# Integers that Triton tells apart: 1, multiples of 16, others, and each width (i32, i64, u64).
INTS = [1, 16, 48, 7, 0, -3, 2**31, 2**40 + 16, 2**63 + 5, -(2**33)]


def perturbed(rng: random.Random, args: tuple) -> tuple:
    """`args` with some tensors moved off or onto 16-byte alignment or to another dtype, some integers
    replaced by ones Triton specialises differently, and floats by other floats."""
    out = []
    for arg in args:
        if isinstance(arg, torch.Tensor) and rng.random() < 0.4:
            dtype = rng.choice([arg.dtype, torch.float32, torch.int32])
            offset = rng.choice([0, 1])
            arg = torch.zeros(arg.numel() + offset, dtype=dtype)[offset:]
        elif type(arg) is int and rng.random() < 0.5:
            arg = rng.choice(INTS)
        elif type(arg) is float:
            arg = rng.random()
        out.append(arg)
    return tuple(out)


def recording(monkeypatch, launch: tuple) -> Recorder:
    """The launcher `launch` names, replaced by a `Recorder` of its kernel. Its module's other launchers record
    too: nothing launches (the tensors are on the CPU, and a GPU machine would run them on the GPU)."""
    module, name = launch
    for attr, value in list(vars(module).items()):
        if isinstance(value, direct_launch.DirectLaunch):
            monkeypatch.setattr(module, attr, Recorder(value.kernel))
    return getattr(module, name)


@pytest.mark.parametrize("launch", list(LAUNCHES), ids=IDS)
def test_one_key_one_variant(launch, monkeypatch) -> None:
    """Launches with one key get one variant from Triton (so a key's variant may be reused), over the wrapper's
    own calls and over arguments perturbed where Triton specialises: alignment, dtype, integers."""
    recorder = recording(monkeypatch, launch)
    kernel = recorder.kernel
    bind = binder(kernel)
    rng = random.Random()
    variants: dict[object, object] = {}
    for _ in range(12):
        LAUNCHES[launch](rng)
    calls = list(recorder.calls)
    assert calls, "the wrapper launched nothing"
    for _, grid, args, constexprs in calls:
        for attempt in range(25):
            args_now = args if attempt == 0 else perturbed(rng, args)
            recorder.run(grid, args_now, constexprs)
            key = recorder.calls[-1][0]
            _, specialisation, _ = bind(*args_now, **constexprs)
            seen = variants.setdefault(key, (specialisation, constexprs))
            assert seen == (specialisation, constexprs), (key, seen, specialisation)
    assert len({repr(spec) for spec, _ in variants.values()}) > len(
        calls
    )  # the perturbations reached variants


@pytest.mark.parametrize("launch", list(LAUNCHES), ids=IDS)
def test_the_wrapper_passes_every_argument_in_order(launch, monkeypatch) -> None:
    """`run`'s arguments are the kernel's non-constexpr parameters in order, and its constexprs name every
    constexpr parameter: what the direct path rebuilds the launcher's argument list from."""
    recorder = recording(monkeypatch, launch)
    kernel = recorder.kernel
    rng = random.Random()
    for _ in range(6):
        LAUNCHES[launch](rng)
    params = jitted(kernel).params
    runtime = [p.name for p in params if not p.is_constexpr]
    constexpr_names = {p.name for p in params if p.is_constexpr}
    for _, _, args, constexprs in recorder.calls:
        assert kernel.arg_names[: len(args)] == runtime
        assert constexpr_names <= set(constexprs)
        binder(kernel)(*args, **constexprs)  # Triton takes the call as it is


def test_run_goes_direct_for_a_known_key(monkeypatch) -> None:
    """After a key's first launch, `run` hands the variant's launcher what Triton's binder would bind, for new
    tensors and new values of the unspecialised integers; a misaligned tensor or a specialised integer Triton tells
    apart from the last goes through Triton again."""
    kernel = jitted(paged_prefill_attention._prefill_kernel)
    fake = FakeKernel(kernel)
    launcher = direct_launch.DirectLaunch(fake)
    recorder = Recorder(kernel)
    monkeypatch.setattr(direct_launch, "is_interpret", lambda: False)
    active = SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 0x5EED)
    monkeypatch.setattr(direct_launch, "driver", SimpleNamespace(active=active))
    monkeypatch.setattr(paged_prefill_attention, "launcher", recorder)
    rng = random.Random()
    prefill_call(rng)
    _, grid, args, constexprs = recorder.calls[-1]
    launcher.run(grid, args, constexprs)
    assert launcher.launches == [1, 0]
    names = kernel.arg_names
    index = {name: names.index(name) for name in ("q_ptr", "first_seq", "num_q_heads")}
    again = list(args)
    again[index["q_ptr"]] = torch.zeros_like(args[index["q_ptr"]])
    again[index["first_seq"]] = args[index["first_seq"]] + 3  # do_not_specialize: the same variant
    launcher.run(grid, again, constexprs)
    assert launcher.launches == [1, 1]
    (launched,) = fake.variant.launched
    assert launched[:9] == (*grid, *(1,) * (3 - len(grid)), 0x5EED, 0xF00, ("packed",), None, None, None)
    bound = list(binder(kernel)(*again, **constexprs)[0].values())
    assert len(launched[9:]) == len(bound) == len(names)
    for name, got, want in zip(names, launched[9:], bound, strict=True):
        assert got is want if isinstance(want, torch.Tensor) else got == want, name
    misaligned = list(again)
    misaligned[index["q_ptr"]] = torch.zeros(again[index["q_ptr"]].numel() + 1, dtype=again[0].dtype)[1:]
    launcher.run(grid, misaligned, constexprs)
    assert launcher.launches == [2, 1]
    other_heads = list(again)
    other_heads[index["num_q_heads"]] = 1 if args[index["num_q_heads"]] != 1 else 16
    launcher.run(grid, other_heads, constexprs)
    assert launcher.launches == [3, 1]
