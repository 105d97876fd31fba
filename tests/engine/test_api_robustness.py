"""The engine-level API under misuse and failure, as a vLLM user expects `LLMEngine` / `LLM` to behave: bad
params, params changed after add, several ids aborted at once, auto ids beside the caller's, a step that
raises, a generate call interrupted. Each test failed before its fix."""

from __future__ import annotations

import pytest

from roseinfer import LLM, InvalidRequestError, SamplingParams


def make(llama_dir: str, **kw) -> LLM:
    kw.setdefault("cpu_kv_tokens", 2048)
    return LLM(llama_dir, device="cpu", dtype="float32", block_size=4, **kw)


def greedy(n_tokens: int = 6, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True, **kw)


PROMPTS = [list(range(10, 22)), [50, 51, 52, 53, 54, 55, 56, 57, 58]]


def token_ids(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def run(engine) -> dict[str, list[int]]:
    """Steps `engine` until it is idle; the final token ids of each request."""
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step(final_only=True):
            done[out.request_id] = out.outputs[0].token_ids
    return done


def assert_idle(llm: LLM) -> None:
    """No request queued or running, and once a step of aborted requests still in flight is resolved, every
    block free."""
    core = llm.engine.core
    assert not llm.engine.groups and not core.scheduler.waiting and not core.scheduler.running
    assert run(llm.engine) == {}
    core.scheduler.check_invariants()
    assert core.kv.num_free_blocks == core.kv.num_blocks


@pytest.fixture(scope="module")
def llm(llama_dir: str) -> LLM:
    return make(llama_dir)


@pytest.mark.parametrize("bad", [None, {"max_tokens": 4}, "greedy"])
def test_params_that_are_not_sampling_params_are_a_value_error_and_the_rest_run(llm: LLM, bad) -> None:
    """They raised AttributeError before the check, so `generate` let it out and left the prompts it had
    already added queued in the engine."""
    with pytest.raises(ValueError, match="sampling params must be a SamplingParams"):
        llm.engine.add_request([5, 6, 7], bad)
    with pytest.raises(InvalidRequestError) as info:
        llm.generate(PROMPTS, [greedy(), bad], use_tqdm=False)
    assert list(info.value.errors) == [1] and info.value.outputs[0].finished
    assert_idle(llm)


def test_a_params_object_changed_after_add_request_does_not_change_the_request(llm: LLM) -> None:
    """As vLLM, which clones them: the request keeps the params it was added with (all requests once
    shared the caller's object, so the last edit set every request's max_tokens)."""
    engine = llm.engine
    params = greedy(3)
    engine.add_request([5, 6, 7], params, request_id="three")
    params.max_tokens = 7
    engine.add_request([8, 9], params, request_id="seven")
    params.max_tokens = 0  # invalid: checked again when it is added, not taken as it is
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        engine.add_request([8, 9], params)
    done = run(engine)
    assert {rid: len(ids) for rid, ids in done.items()} == {"three": 3, "seven": 7}
    assert_idle(llm)


@pytest.mark.parametrize("ids", [("a", "b"), ["a", "b"], iter(["a", "b"])])
def test_abort_request_takes_several_ids(llm: LLM, ids) -> None:
    """As vLLM's abort_request: a list of ids. A tuple was one unknown id (nothing aborted, silently), a list
    a TypeError."""
    engine = llm.engine
    for rid in ("a", "b", "c"):
        engine.add_request([5, 6, 7], greedy(8), request_id=rid)
    engine.step()
    engine.abort_request(ids)
    assert list(run(engine)) == ["c"]
    assert_idle(llm)


@pytest.mark.parametrize("rid", [5, ("x",), b"x"])
def test_a_request_id_that_is_not_a_string_is_a_value_error(llm: LLM, rid: object) -> None:
    """It was taken, and then could not be aborted by its own id: abort_request(5) raised "'int' object is
    not iterable", abort_request(("x",)) aborted "x". As vLLM, request ids are strings."""
    engine = llm.engine
    with pytest.raises(ValueError, match=f"request_id must be a string, got {type(rid).__name__}"):
        engine.add_request([5, 6, 7], greedy(2), request_id=rid)  # type: ignore[arg-type]
    engine.add_request([5, 6, 7], greedy(2), request_id="ok")
    assert list(run(engine)) == ["ok"]
    assert_idle(llm)


def test_an_automatic_request_id_never_collides_with_the_callers(llama_dir: str) -> None:
    """A request added without an id was refused ("already in use") when the caller had named one "0"."""
    llm = make(llama_dir)
    engine = llm.engine
    taken = ["0", "1", "2"]
    for rid in taken:
        engine.add_request([5, 6, 7], greedy(2), request_id=rid)
    auto = engine.add_request([8, 9], greedy(2))
    assert auto not in taken
    assert set(run(engine)) == {*taken, auto}
    assert_idle(llm)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_step_that_raises_leaves_the_engine_dead_not_wrong(
    llama_dir: str, async_scheduling: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that fails halfway leaves blocks registered in the prefix cache whose KV was never computed,
    and tokens pending that no step will resolve: the engine served wrong tokens from then on, even after
    every request was aborted. As vLLM: the engine is dead, and says so on every later call."""
    want = token_ids(
        make(llama_dir, async_scheduling=async_scheduling).generate(PROMPTS, greedy(), use_tqdm=False)
    )
    llm = make(llama_dir, async_scheduling=async_scheduling)
    model = llm.engine.core.runner.model
    forward, calls = model.forward, [0]

    def fails_once(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("device fault")
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", fails_once)
    with pytest.raises(RuntimeError, match="device fault"):
        llm.generate(PROMPTS, greedy(), use_tqdm=False)
    for rid in list(llm.engine.groups):
        llm.engine.abort_request(rid)
    try:
        got = token_ids(llm.generate(PROMPTS, greedy(), use_tqdm=False))
    except RuntimeError as e:
        assert "engine is dead" in str(e) and "device fault" in str(e)
    else:
        assert got == want, "silently wrong output after a failed step"
        pytest.fail("a failed step left the engine serving")
    with pytest.raises(RuntimeError, match="engine is dead"):
        llm.engine.add_request([5, 6, 7], greedy())


def test_an_interrupted_generate_leaves_no_request_behind(llama_dir: str, monkeypatch) -> None:
    """As vLLM aborts what it added when adding fails: a generate call left by an exception (Ctrl-C between
    steps) aborts its requests. They stayed queued and the next call ran them all before its own."""
    llm = make(llama_dir)
    engine = llm.engine
    step, calls = engine.step, [0]

    def interrupted(final_only: bool = False):
        calls[0] += 1
        outs = step(final_only)
        if calls[0] == 2:
            raise KeyboardInterrupt
        return outs

    monkeypatch.setattr(engine, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, greedy(), use_tqdm=False)
    monkeypatch.undo()
    assert_idle(llm)
    assert token_ids(llm.generate(PROMPTS, greedy(), use_tqdm=False)) == token_ids(
        make(llama_dir).generate(PROMPTS, greedy(), use_tqdm=False)
    )
