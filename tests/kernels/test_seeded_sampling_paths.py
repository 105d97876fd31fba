"""A seeded row's tokens depend on its seed and logits alone, whichever sampler its batch takes on CUDA."""

from __future__ import annotations

import torch

from roseinfer.runner.sampler import SamplingBatch, sample
from roseinfer.sampling_params import SamplingParams
from tests.kernels.kernel_utils import DEVICE, HAS_CUDA


class _ReportsCuda(torch.Tensor):
    """CPU logits that report CUDA, so that `sample` takes its CUDA route (the Triton kernels run through the
    interpreter); on a GPU the logits are CUDA tensors themselves."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_a_seeded_row_draws_the_same_beside_a_top_k_row() -> None:
    """vLLM promises a seeded request the same output whatever its batch holds. A batch of plain-temperature
    rows took the fused Triton sampler on CUDA, seeding its Philox noise with one draw of the row's generator;
    a batch with a top-k (top-p, min-p) row beside it took the torch sampler, with exponential noise from that
    generator: the seeded row's tokens changed with its neighbour's settings."""
    vocab, steps = 64, 8
    logits = torch.zeros(2, vocab, device=DEVICE)  # flat: every token equally likely at each step
    if not HAS_CUDA:
        logits = logits.as_subclass(_ReportsCuda)
    seeded = SamplingParams(temperature=1.0, seed=7)
    device = logits.device

    def tokens(params: list[SamplingParams]) -> list[int]:
        gen = torch.Generator(device=device).manual_seed(7)
        gens: list[torch.Generator | None] = [gen] + [None] * (len(params) - 1)
        batch = SamplingBatch.build(
            params, gens, vocab, device, torch.Generator(device=device).manual_seed(0)
        )
        return [int(sample(logits[: len(params)], batch)[0]) for _ in range(steps)]

    alone = tokens([seeded])
    assert len(set(alone)) > 1
    assert tokens([seeded, SamplingParams(temperature=1.0, top_k=5)]) == alone
    assert tokens([seeded, SamplingParams(temperature=0.5)]) == alone
