"""The engine checks of tests/conftest.py can fail: each test breaks invariant 4 ("every request reaches one
terminal state and then holds nothing") the way a bug would and sees the check after the step or abort catch
it, in whatever test drives the engine."""

from __future__ import annotations

import pytest

from roseinfer import LLM, SamplingParams
from roseinfer.engine.core import EngineCore
from roseinfer.engine.request_outputs import RequestGroup
from roseinfer.request import Request, RequestStatus
from roseinfer.runner.model_runner import ModelRunner


def make(llama_dir: str) -> LLM:
    return LLM(llama_dir, device="cpu", dtype="float32", block_size=4, cpu_kv_tokens=256)


def test_a_finished_request_keeping_its_generator_is_caught(
    llama_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ModelRunner, "release", lambda self, req: None)
    llm = make(llama_dir)
    with pytest.raises(AssertionError, match="still has a sampling generator"):
        llm.generate([[5, 6, 7]], SamplingParams(temperature=1.0, seed=3, max_tokens=2), use_tqdm=False)


def test_an_idle_engine_keeping_a_request_group_is_caught(
    llama_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(RequestGroup, "finished", property(lambda self: False))
    llm = make(llama_dir)
    with pytest.raises(AssertionError, match="idle engine keeps request groups"):
        llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)


def test_an_abort_that_leaves_a_sample_running_is_caught(
    llama_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n = 2: an abort that finishes the request but not the sample forked from it."""
    finish = EngineCore.finish

    def finish_roots_only(self: EngineCore, req: Request, status: RequestStatus) -> None:
        if req.parent is None:
            finish(self, req, status)

    monkeypatch.setattr(EngineCore, "finish", finish_roots_only)
    llm = make(llama_dir)
    engine = llm.engine
    rid = engine.add_request([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=8, n=2, ignore_eos=True))
    while len(engine.core.scheduler.running) < 2:
        engine.step()
    with pytest.raises(AssertionError, match="still queued after its request was aborted"):
        engine.abort_request(rid)
