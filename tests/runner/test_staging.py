import numpy as np
import pytest
import torch

from roseinfer.runner.inputs import ALIGN, Staging


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
