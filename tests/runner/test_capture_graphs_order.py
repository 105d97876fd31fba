"""`capture_graphs` on stand-ins for torch.cuda's graph API: sizes largest first, each warmed up eagerly before its
capture, every capture after the first into the first graph's pool, and a progress bar named for the graphs."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from roseinfer.runner import cuda_graphs


def test_graphs_are_captured_largest_first_into_one_pool(monkeypatch) -> None:
    events: list[tuple] = []
    created: list[object] = []

    class StandInGraph:
        def __init__(self) -> None:
            self.index = len(created)
            created.append(self)

        def pool(self) -> tuple[str, int]:
            return ("pool of", self.index)

    @contextmanager
    def capturing(graph: StandInGraph, pool: object = None):
        events.append(("capture", graph.index, pool))
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", StandInGraph)
    monkeypatch.setattr(torch.cuda, "graph", capturing)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    bars: list[dict] = []
    real_tqdm = cuda_graphs.tqdm
    monkeypatch.setattr(cuda_graphs, "tqdm", lambda it, **kw: bars.append(kw) or real_tqdm(it, **kw))

    def body(size: int, meta: str) -> torch.Tensor:
        events.append(("body", size, meta))
        return torch.full((size,), size)

    graphs = cuda_graphs.capture_graphs(
        [1, 4, 2], lambda size: f"meta {size}", body, torch.device("cpu"), "decode"
    )
    assert events == [
        ("body", 4, "meta 4"),  # the eager warm-up
        ("capture", 0, None),
        ("body", 4, "meta 4"),
        ("body", 2, "meta 2"),
        ("capture", 1, ("pool of", 0)),
        ("body", 2, "meta 2"),
        ("body", 1, "meta 1"),
        ("capture", 2, ("pool of", 1)),
        ("body", 1, "meta 1"),
    ]
    assert sorted(graphs) == [1, 2, 4]
    for size, (graph, out) in graphs.items():
        assert graph is created[{4: 0, 2: 1, 1: 2}[size]] and out.tolist() == [size] * size
    assert len(bars) == 1 and bars[0]["desc"] == "decode" and bars[0]["unit"] == "graph"
    assert bars[0]["disable"] is None  # shown on a terminal only: no carriage returns in a log file
