"""The HF `generate` peer of `bench throughput` (`roseinfer.bench.hf_peer`), with HF's model and the clock faked:
how requests are batched, the left-padded batch and the sampling options `generate` gets (full-vocabulary
sampling as roseinfer's, or greedy; never stopping early), and the figures of a run: completion tokens are each
request's own length (not the padding), prefill = elapsed - decode, decode = from each batch's first logits to
its end."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from roseinfer.bench import hf_peer
from roseinfer.bench.workloads import Workload
from roseinfer.sampling_params import SamplingParams


def workload(prompt_lens: list[int], output_lens: list[int], temperature: float = 0.0) -> Workload:
    prompts = [list(range(1000, 1000 + n)) for n in prompt_lens]
    params = [SamplingParams(max_tokens=o, temperature=temperature, ignore_eos=True) for o in output_lens]
    return Workload("test", "test", prompts, params)


def test_hf_batches_take_every_request_once_all_at_once_when_uniform_else_64():
    rng = np.random.default_rng()
    for _ in range(20):
        n = int(rng.integers(1, 300))
        uniform = bool(rng.integers(2))
        prompts = [7] * n if uniform else [int(x) for x in rng.integers(1, 9, size=n)]
        outputs = [3] * n
        if not uniform and len(set(prompts)) == 1:
            outputs[-1] = 4  # only the outputs differ: still not uniform
        w = workload(prompts, outputs)
        given = int(rng.integers(1, 100)) if rng.integers(2) else None
        batches = hf_peer._hf_batches(w, given)
        size = given or (n if uniform else 64)
        assert [i for b in batches for i in b] == list(range(n))
        assert all(len(b) == size for b in batches[:-1]) and 0 < len(batches[-1]) <= size
    w = workload([5] * 70, [3] * 69 + [4])  # the same prompts, one longer output: batches of 64
    assert [len(b) for b in hf_peer._hf_batches(w, None)] == [64, 6]
    w = workload([5] * 69 + [6], [3] * 70)
    assert [len(b) for b in hf_peer._hf_batches(w, None)] == [64, 6]


class FakeHF:
    """Records what `generate` was given; returns the input ids followed by `max_new_tokens` new ones, after one
    call of the logits processors."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def generate(self, ids: torch.Tensor, **kw: Any) -> torch.Tensor:
        self.calls.append({"ids": ids, **kw})
        for proc in kw["logits_processor"]:
            proc(ids, torch.zeros(ids.shape[0], 10))
        new = torch.arange(ids.shape[0] * kw["max_new_tokens"]).view(ids.shape[0], -1) + 5
        return torch.cat([ids, new], dim=1)


@pytest.mark.parametrize("temperature", [0.0, 0.6])
def test_hf_batch_is_left_padded_and_samples_as_roseinfer_does(temperature: float):
    rng = np.random.default_rng()
    prompts = [rng.integers(1000, 32000, size=int(rng.integers(1, 20))).tolist() for _ in range(5)]
    max_new = int(rng.integers(1, 9))
    hf = FakeHF()
    new, first = hf_peer.hf_generate_batch(hf, prompts, max_new, temperature, torch.device("cpu"))  # type: ignore[arg-type]
    (call,) = hf.calls
    width = max(map(len, prompts))
    for row, p in enumerate(prompts):
        pad = width - len(p)
        assert call["ids"][row].tolist() == [0] * pad + p  # padding on the left: every prompt ends at `width`
        assert call["attention_mask"][row].tolist() == [0] * pad + [1] * len(p)
    assert call["max_new_tokens"] == call["min_new_tokens"] == max_new  # no early stop
    if temperature:  # plain temperature sampling over the whole vocabulary
        assert call["do_sample"] is True and call["temperature"] == temperature
        assert call["top_k"] == 0 and call["top_p"] == 1.0
    else:
        assert call["do_sample"] is False
    assert new.tolist() == (torch.arange(5 * max_new).view(5, -1) + 5).tolist()
    assert first is not None


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def test_hf_run_figures(monkeypatch):
    rng = np.random.default_rng()
    n = int(rng.integers(3, 20))
    outputs = [int(x) for x in rng.permutation(np.arange(1, 40))[:n]]  # distinct: every batch of 2+ pads
    w = workload([int(x) for x in rng.integers(1, 30, size=n)], outputs, 0.6)
    clock = FakeClock()
    seen: list[tuple[list[list[int]], int, float]] = []
    phases: list[tuple[float, float]] = []

    def fake_generate(model: Any, prompts: list[list[int]], max_new: int, temperature: float, device: Any):
        seen.append((prompts, max_new, temperature))
        prefill, decode = (float(x) for x in rng.uniform(0.01, 1, size=2))
        phases.append((prefill, decode))
        clock.now += prefill
        first = clock.now
        clock.now += decode
        return torch.zeros(len(prompts), max_new, dtype=torch.long), first

    monkeypatch.setattr(hf_peer, "time", clock)
    syncs: list[float] = []

    def fake_sync(device: Any) -> None:  # time between batches (syncs 1, 3, ...: before each batch starts)
        syncs.append(float(rng.uniform(0.01, 1)) if len(syncs) % 2 else 0.0)
        clock.now += syncs[-1]

    monkeypatch.setattr(hf_peer, "sync", fake_sync)
    monkeypatch.setattr(hf_peer, "hf_generate_batch", fake_generate)
    batch = int(rng.integers(2, n))
    start = clock.now
    r = hf_peer.run_hf(None, w, torch.device("cpu"), batch)  # type: ignore[arg-type]
    batches = [list(range(i, min(i + batch, n))) for i in range(0, n, batch)]
    assert [s[0] for s in seen] == [[w.prompts[i] for i in b] for b in batches]
    assert [s[1] for s in seen] == [max(w.output_lens[i] for i in b) for b in batches]
    assert all(s[2] == 0.6 for s in seen)
    total = clock.now - start
    assert r.total_time == pytest.approx(total, rel=1e-12)
    assert r.decode_time == pytest.approx(sum(d for _, d in phases), rel=1e-12)
    assert sum(syncs) > 0 and r.prefill_time == pytest.approx(total - r.decode_time, rel=1e-12)
    assert r.extra["prefill_forward_time"] == pytest.approx(sum(p for p, _ in phases), rel=1e-12)
    assert r.completion_tokens == sum(w.output_lens) and r.prompt_tokens == sum(w.prompt_lens)
    assert r.extra["num_batches"] == len(batches)
    assert r.extra["generated_tokens_incl_padding"] == sum(
        len(b) * max(w.output_lens[i] for i in b) for b in batches
    )
    assert r.name == "hf" and r.num_requests == n

    mixed = Workload(
        "test", "test", w.prompts[:2], [SamplingParams(max_tokens=2, temperature=t) for t in (0, 1)]
    )
    with pytest.raises(ValueError, match="one temperature"):
        hf_peer.run_hf(None, mixed, torch.device("cpu"), 2)  # type: ignore[arg-type]


def test_hf_run_refuses_a_batch_that_stopped_early(monkeypatch):
    w = workload([3, 4], [5, 5])
    monkeypatch.setattr(
        hf_peer, "hf_generate_batch", lambda m, p, max_new, t, d: (torch.zeros(len(p), max_new - 1), None)
    )
    with pytest.raises(RuntimeError, match="4 new tokens, asked for 5"):
        hf_peer.run_hf(SimpleNamespace(), w, torch.device("cpu"), None)  # type: ignore[arg-type]
