"""Small host arrays to the device without waiting for the queued steps."""

from __future__ import annotations

import numpy as np
import torch


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """`array` on `device` (the array itself as a tensor on the CPU). On CUDA through pinned memory, queued
    behind the launched work: a copy from pageable memory would wait for the queued steps."""
    host = torch.from_numpy(array)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
