"""`DirectLaunch` (launches that skip Triton's per-call binding once a key has compiled), on the warp-specialised
prefill launch, its one user. No GPU needed: Triton's own binder, built for sm_90, says what each launch would
specialise on, and a stand-in for the compiled variant records what the direct path hands its launcher."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia import driver as nvidia_driver  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from roseinfer.kernels import direct_launch, paged_prefill_ws  # noqa: E402
from roseinfer.kernels.prefill_plan import TILE_ROWS  # noqa: E402

KERNEL = paged_prefill_ws._prefill_ws_kernel
BINDER = create_function_from_signature(
    KERNEL.signature, KERNEL.params, make_backend(GPUTarget("cuda", 90, 32))
)


class Recorder:
    """Stands in for the module's DirectLaunch: keeps each call's key and arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, key, grid, args, constexprs, jit_args=None) -> None:
        self.calls.append((key, grid, args, constexprs, jit_args))


def ws_call(rng: random.Random, dtype, heads, kv_heads, block_size, q_offset, qkv_rows, tile_map, first_seq):
    """paged_prefill_attention_ws's arguments on CPU tensors, a launch's worth of one drawn case."""
    width = heads + 2 * kv_heads if qkv_rows else heads
    tokens = rng.randint(1, 300)
    buffer = torch.zeros(tokens * width * 128 + q_offset, dtype=dtype)
    q = buffer[q_offset:].view(tokens, width, 128)[:, :heads]
    cache = torch.zeros(rng.randint(2, 40), 2, block_size, kv_heads, 128, dtype=dtype)
    seqs = first_seq + rng.randint(1, 4)
    tables = torch.zeros(seqs, rng.randint(1, 70), dtype=torch.int32)
    qsl = torch.zeros(seqs + 1, dtype=torch.int32)
    seq_lens = torch.zeros(seqs, dtype=torch.int32)
    tiles = torch.zeros(TILE_ROWS, rng.randint(1, 50), dtype=torch.int32) if tile_map else None
    out = torch.empty(tokens, heads, 128, dtype=dtype)
    return (
        q,
        cache[:, 0],
        cache[:, 1],
        tables,
        qsl,
        seq_lens,
        rng.randint(1, 300),
        0.088,
        out,
        first_seq,
        tiles,
    )


CASES = list(
    itertools.product(
        [torch.bfloat16, torch.float16],
        [(32, 8), (28, 4), (8, 8)],
        [16, 64],
        [0, 1, 8],  # q's offset in elements: 16-byte aligned, not, aligned again
        [False, True],  # q a slice of fused qkv rows
        [False, True],
        [0, 1],
    )
)


def test_a_launch_key_fixes_what_triton_specialises(monkeypatch) -> None:
    """Launches with one key would get one variant from Triton, so reusing the key's variant is safe; and the
    cases do reach several variants (aligned and not, each head shape, tile map or grid, each dtype)."""
    recorder = Recorder()
    monkeypatch.setattr(paged_prefill_ws, "launcher", recorder)
    rng = random.Random()
    variants: dict[object, object] = {}
    for dtype, (heads, kv_heads), block_size, offset, qkv_rows, tile_map, first_seq in CASES:
        args = ws_call(rng, dtype, heads, kv_heads, block_size, offset, qkv_rows, tile_map, first_seq)
        paged_prefill_ws.paged_prefill_attention_ws(*args)
        key, _, _, constexprs, jit_args = recorder.calls[-1]
        _, specialisation, _ = BINDER(*jit_args(), **constexprs)
        seen = variants.setdefault(key, (specialisation, constexprs))
        assert seen == (specialisation, constexprs), (key, seen, specialisation)
    # 2 dtypes x 3 head shapes x 2 page sizes x 2 alignments x 2 launch kinds (q's row strides, fused or not,
    # are multiples of 16 alike)
    assert len({repr(v) for v in variants.values()}) == 2 * 3 * 2 * 2 * 2


class FakeVariant:
    """A compiled variant whose launcher records its arguments."""

    function = 0xF00
    packed_metadata = ("packed",)

    def __init__(self) -> None:
        self.launched: list[tuple] = []

    def run(self, *args) -> None:
        self.launched.append(args)


class FakeKernel:
    """`kernel[grid](...)` of `kernel`: records the call and returns its variant, as JITFunction.run does."""

    def __init__(self, kernel=KERNEL) -> None:
        self.arg_names = kernel.arg_names
        self.do_not_specialize = kernel.do_not_specialize
        self.bound: list[tuple] = []
        self.variant = FakeVariant()

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.bound.append((grid, args, kwargs))
            return self.variant

        return run


def descriptor_fields(d) -> tuple:
    return (d.base.data_ptr(), list(d.shape), list(d.strides), d.padding)


def test_the_direct_path_hands_the_launcher_what_triton_would(monkeypatch) -> None:
    """A key's first launch goes through `kernel[grid]` with real tensor descriptors; the next with that key goes
    to the variant's launcher with the grid, the current stream and the arguments Triton's binder would bind
    (descriptors as their base, shape, strides and padding); a new key, or a launch hook set, goes through
    Triton again."""
    fake = FakeKernel()
    launcher = direct_launch.DirectLaunch(fake)
    monkeypatch.setattr(paged_prefill_ws, "launcher", launcher)
    monkeypatch.setattr(direct_launch, "is_interpret", lambda: False)
    stream = 0x5EED
    active = SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: stream)
    monkeypatch.setattr(direct_launch, "driver", SimpleNamespace(active=active))
    rng = random.Random()
    first = ws_call(rng, torch.bfloat16, 32, 8, 16, 0, True, True, 0)
    paged_prefill_ws.paged_prefill_attention_ws(*first)
    assert launcher.launches == [1, 0] and len(fake.bound) == 1
    assert isinstance(fake.bound[0][1][1], paged_prefill_ws.TensorDescriptor)

    again = ws_call(rng, torch.bfloat16, 32, 8, 16, 0, True, True, 0)  # new tensors and sizes, the same key
    paged_prefill_ws.paged_prefill_attention_ws(*again)
    assert launcher.launches == [1, 1] and len(fake.bound) == 1
    (launched,) = fake.variant.launched
    grid = (32 * again[10].shape[1], 1, 1)
    assert launched[:9] == (
        *grid,
        stream,
        FakeVariant.function,
        FakeVariant.packed_metadata,
        None,
        None,
        None,
    )
    recorder = Recorder()
    monkeypatch.setattr(paged_prefill_ws, "launcher", recorder)
    paged_prefill_ws.paged_prefill_attention_ws(*again)
    _, _, _, constexprs, jit_args = recorder.calls[-1]
    bound = list(BINDER(*jit_args(), **constexprs)[0].values())
    direct = list(launched[9:])
    assert len(direct) == len(bound) == len(KERNEL.arg_names)
    for name, got, want in zip(KERNEL.arg_names, direct, bound, strict=True):
        if isinstance(want, paged_prefill_ws.TensorDescriptor):
            assert descriptor_fields(got) == descriptor_fields(want), name
        elif isinstance(want, torch.Tensor):
            assert got is want, name
        else:
            assert got == want, name

    monkeypatch.setattr(paged_prefill_ws, "launcher", launcher)
    misaligned = ws_call(rng, torch.bfloat16, 32, 8, 16, 1, True, True, 0)
    paged_prefill_ws.paged_prefill_attention_ws(*misaligned)
    assert launcher.launches == [2, 1]
    hooks = knobs.HookChain()
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", hooks)
    paged_prefill_ws.paged_prefill_attention_ws(*again)  # an empty chain: no hook set
    assert launcher.launches == [2, 2]
    hooks.add(lambda metadata: None)
    paged_prefill_ws.paged_prefill_attention_ws(*again)
    assert launcher.launches == [3, 2] and len(fake.variant.launched) == 2


class DescriptorVariant:
    """A compiled variant with tensor descriptors, as Triton 3.6 builds its launcher: the compiled `launch`
    (here a recorder) under Triton's own `wrap_handle_tensordesc`, which encodes each descriptor on every call."""

    function = 0xF00
    packed_metadata = ("packed",)

    def __init__(self, signature: dict[str, str], metas: list[dict], scratch: int = 0) -> None:
        self.src = SimpleNamespace(signature=signature)
        self.metadata = SimpleNamespace(tensordesc_meta=metas)
        self.raw: list[tuple] = []
        launch = nvidia_driver.wrap_handle_tensordesc(lambda *args: self.raw.append(args), signature, metas)
        self.run = SimpleNamespace(
            launch=launch,
            launch_cooperative_grid=False,
            launch_pdl=True,
            global_scratch_size=scratch,
            profile_scratch_size=0,
        )


def test_the_direct_path_encodes_each_descriptor_once(monkeypatch) -> None:
    """Beneath Triton's descriptor wrapper, the direct path hands the compiled launcher what the wrapper would
    (the same call, argument for argument), but encodes a layer's K and V descriptors on their first launch only:
    new queries, tables and tile maps over the same cache encode nothing, another cache (of another shape, or
    of the same) encodes its own, and `forget` drops them. A variant that needs scratch memory keeps Triton's launcher."""

    def encode(desc, meta) -> list:  # a stand-in for the encoding, which needs a GPU: what it encodes
        return [
            ("tma", desc.base.data_ptr(), tuple(desc.shape), tuple(desc.strides), meta["box"]),
            *desc.shape,
        ]

    monkeypatch.setattr(nvidia_driver, "make_tensordesc_arg", encode)
    monkeypatch.setattr(direct_launch, "make_tensordesc_arg", encode)
    monkeypatch.setattr(direct_launch, "is_interpret", lambda: False)
    active = SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 0x5EED)
    monkeypatch.setattr(direct_launch, "driver", SimpleNamespace(active=active))
    rng = random.Random()
    first = ws_call(rng, torch.bfloat16, 32, 8, 16, 0, True, True, 0)
    recorder = Recorder()
    monkeypatch.setattr(paged_prefill_ws, "launcher", recorder)
    paged_prefill_ws.paged_prefill_attention_ws(*first)
    _, _, _, constexprs, jit_args = recorder.calls[-1]
    types = [ty for ty, _ in BINDER(*jit_args(), **constexprs)[1]]
    signature = dict(zip(KERNEL.arg_names, types, strict=True))
    assert [ty.startswith("tensordesc") for ty in types[:4]] == [False, True, True, False]
    variant = DescriptorVariant(signature, [{"box": "k"}, {"box": "v"}])
    fake = FakeKernel()
    fake.variant = variant
    launcher = direct_launch.DirectLaunch(fake)
    monkeypatch.setattr(paged_prefill_ws, "launcher", launcher)
    paged_prefill_ws.paged_prefill_attention_ws(*first)  # through Triton: the variant is found
    assert launcher.launches == [1, 0] and launcher.variants[(0, recorder.calls[-1][0])].launch is not None

    def direct_and_wrapped(args: tuple) -> tuple[tuple, tuple]:
        """The raw launch of the direct path, and the one Triton's wrapper makes of the same arguments."""
        paged_prefill_ws.paged_prefill_attention_ws(*args)
        monkeypatch.setattr(paged_prefill_ws, "launcher", recorder)
        paged_prefill_ws.paged_prefill_attention_ws(*args)
        monkeypatch.setattr(paged_prefill_ws, "launcher", launcher)
        _, grid, stand_ins, constexprs, _ = recorder.calls[-1]
        values = [*stand_ins, *(constexprs[n] for n in KERNEL.arg_names[len(stand_ins) :])]
        g = (*grid, 1, 1)
        variant.run.launch(*g, 0x5EED, variant.function, False, True, None, None, ("packed",), None, None, None,
                           *values)  # fmt: skip
        return variant.raw[-2], variant.raw[-1]

    caches = first[1:3]
    for n in range(3):  # new queries, tables and maps over the first call's cache
        again = ws_call(rng, torch.bfloat16, 32, 8, 16, 0, True, True, 0)
        direct, wrapped = direct_and_wrapped((again[0], *caches, *again[3:]))
        assert direct == wrapped
        assert direct[5:7] == (False, True) and direct[9] == ("packed",)
        assert launcher.encodings == 2, n  # K and V, on the first direct launch
    other = ws_call(rng, torch.bfloat16, 32, 8, 16, 0, True, True, 0)
    direct, wrapped = direct_and_wrapped(other)
    assert direct == wrapped and launcher.encodings == 4 and launcher.launches == [1, 4]
    same_shape = torch.zeros_like(other[1]._base)  # another layer's cache: the same page shape and strides
    direct, wrapped = direct_and_wrapped((other[0], same_shape[:, 0], same_shape[:, 1], *other[3:]))
    assert direct == wrapped and launcher.encodings == 6
    launcher.forget()
    assert not launcher.descriptors and not launcher.variants
    assert direct_launch.direct_variant(DescriptorVariant(signature, [{}, {}], scratch=64)).launch is None
    assert direct_launch.direct_variant(FakeVariant()).launch is None  # no descriptor wrapper
