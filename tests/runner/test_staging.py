from types import SimpleNamespace

import numpy as np
import pytest
import torch

from roseinfer.kernels.prefill_plan import SPLIT_PARTIAL_ROWS
from roseinfer.runner.inputs import ALIGN, Staging, build_host_step, upload_step
from roseinfer.scheduler.scheduler import ScheduledRequest, SchedulerOutput


@pytest.mark.parametrize("sizes", [[1], [3, 5, 17], [16, 1, 33, 2], [7, 0, 9]])
def test_upload_round_trips_and_aligns_every_view(sizes: list[int]) -> None:
    rng = np.random.default_rng(len(sizes))
    arrays = [rng.integers(-1000, 1000, size=n).astype(np.int32) for n in sizes]
    staging = Staging(torch.device("cpu"), capacity=8)  # too small: upload grows it
    views = staging.upload(arrays)
    for a, v in zip(arrays, views, strict=True):
        assert v.storage_offset() % ALIGN == 0
        np.testing.assert_array_equal(v.numpy(), a)


def test_upload_keeps_two_dimensional_shapes() -> None:
    table = np.arange(12, dtype=np.int32).reshape(3, 4)
    (first, view) = Staging(torch.device("cpu")).upload([np.ones(5, np.int32), table])
    assert view.shape == (3, 4) and view.storage_offset() % ALIGN == 0
    np.testing.assert_array_equal(view.numpy(), table)
    np.testing.assert_array_equal(first.numpy(), np.ones(5))


def _scheduled(context: int, new: int) -> ScheduledRequest:
    """A request with `context` tokens computed and `new` fed this step, its blocks 0, 1, ..."""
    tokens = list(range(100, 100 + context + new))
    request = SimpleNamespace(
        all_token_ids=tokens, block_ids=list(range(-(-len(tokens) // 4))), pending_row=0
    )
    return ScheduledRequest(request, new, 1, start=context)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("contexts", "q_lens", "want"),
    [
        ([3, 40, 9, 40], [1, 1, 1, 1], [1, 3, 2, 0]),  # decode only: every row, longest first
        ([3, 40, 9, 0], [1, 1, 1, 6], [1, 2, 0]),  # a chunk behind three decodes: the decodes only
        ([0, 40], [5, 1], []),  # no leading decode
    ],
)
def test_step_sends_the_decode_rows_longest_first(contexts, q_lens, want) -> None:
    out = SchedulerOutput([_scheduled(c, n) for c, n in zip(contexts, q_lens, strict=True)])
    step = build_host_step(out, block_size=4)
    assert step.decode_order.tolist() == want
    _, _, meta, _ = upload_step(step, Staging(torch.device("cpu")))
    if want:
        assert meta.decode_order is not None and meta.decode_order.tolist() == want
    else:
        assert meta.decode_order is None


@pytest.mark.parametrize("cut", [False, True])
def test_a_map_takes_partial_rows_only_where_it_cuts_keys(cut: bool) -> None:
    """A tile map sent with the step: the launch gets partial rows (the kernel's merge variant) only where some
    tile's keys are split across programs."""
    out = SchedulerOutput([_scheduled(0, 6)])
    step = build_host_step(out, block_size=4)
    # rows: sequence, q tile, key split, splits, first partial row; one program, or the tile's keys cut in two
    one = [[0], [0], [0], [1], [0]]
    tiles = np.array([[0, 0], [0, 0], [0, 1], [2, 2], [0, 0]] if cut else one, np.int32)
    _, _, meta, _ = upload_step(step, Staging(torch.device("cpu")), tiles=(tiles, 64))
    assert meta.tile_block_m == 64 and meta.prefill_tiles is not None
    np.testing.assert_array_equal(meta.prefill_tiles.numpy(), tiles)
    assert meta.split_rows == (SPLIT_PARTIAL_ROWS if cut else 0)
