"""The online engines, `AsyncLLMEngine` (the engine stepped on a thread of its own) and `EngineProcess` (in a process
of its own), each request an async stream. Outputs match the offline engine's; a caller that stops reading aborts
its request and frees its blocks; a bad request, a duplicate id or a closed engine harms no other request; a
failed step ends every open stream with the error."""

from __future__ import annotations

import asyncio
import os
from functools import partial

import pytest

from roseinfer import LLM, RequestOutputKind, SamplingParams
from roseinfer.engine.async_engine import AsyncLLMEngine
from roseinfer.engine.engine_process import EngineProcess
from roseinfer.engine.request_stream import EngineDeadError
from tests.serve import engine_state

PROMPTS = [[1, 2, 3], [7, 8, 9, 10, 11], [5], [20, 21, 22, 23, 24, 25, 26, 27, 28]]


def greedy(max_tokens: int, kind: RequestOutputKind = RequestOutputKind.DELTA) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, output_kind=kind)


def make_llm() -> LLM:
    return LLM("tiny-llama", load_format="dummy", device="cpu", block_size=4, num_kv_blocks=96)


@pytest.fixture(params=["thread", "process"])
def engine(request):
    if request.param == "thread":
        online: AsyncLLMEngine | EngineProcess = AsyncLLMEngine(make_llm().engine)
    else:
        online = EngineProcess("tiny-llama", load_format="dummy", device="cpu", block_size=4, num_kv_blocks=96)
    yield online
    online.close()


async def collect(engine, prompt: list[int], params: SamplingParams) -> list[int]:
    tokens: list[int] = []
    async for out in engine.generate(prompt, params):
        tokens += out.outputs[0].token_ids
    return tokens


async def idle_state(engine) -> tuple[bool, float]:
    """(any request held, KV usage), read where the engine runs, after a settling pause."""
    await asyncio.sleep(0.05)
    state = await engine.call(engine_state.load)
    return bool(state["busy"]), state["usage"]


def test_concurrent_streams_match_the_offline_engine(engine) -> None:
    lengths = [6, 3, 9, 5]

    async def main() -> list[list[int]]:
        return await asyncio.gather(*(collect(engine, p, greedy(n)) for p, n in zip(PROMPTS, lengths)))

    streamed = asyncio.run(main())
    offline = [
        out.outputs[0].token_ids
        for out in make_llm().generate(PROMPTS, [greedy(n, RequestOutputKind.FINAL_ONLY) for n in lengths], use_tqdm=False)
    ]
    assert streamed == offline
    assert [len(t) for t in streamed] == lengths


def test_final_only_gives_one_finished_output(engine) -> None:
    async def main() -> list:
        return [out async for out in engine.generate([1, 2], greedy(4, RequestOutputKind.FINAL_ONLY))]

    outs = asyncio.run(main())
    assert len(outs) == 1 and outs[0].finished and len(outs[0].outputs[0].token_ids) == 4


def test_a_reader_that_leaves_aborts_its_request(engine) -> None:
    async def main() -> tuple[list[int], tuple]:
        got: list[int] = []
        async for out in engine.generate([1, 2, 3], greedy(300)):
            got += out.outputs[0].token_ids
            if len(got) >= 3:
                break  # leaves the stream: the request must be aborted
        return got, await idle_state(engine)

    got, (busy, usage) = asyncio.run(main())
    assert len(got) >= 3
    assert (busy, usage) == (False, 0.0)


def test_a_cancelled_task_aborts_its_request(engine) -> None:
    async def main() -> tuple:
        task = asyncio.create_task(collect(engine, [4, 5, 6], greedy(300)))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await idle_state(engine)

    assert asyncio.run(main()) == (False, 0.0)


def test_a_bad_request_raises_at_add_and_harms_nobody(engine) -> None:
    async def main() -> list[int]:
        good = asyncio.create_task(collect(engine, [1, 2, 3], greedy(8)))
        with pytest.raises(ValueError, match="max_model_len"):
            await engine.add_request([1, 2, 3], greedy(10**9))
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await engine.add_request([1, 10**9], greedy(4))
        return await good

    assert len(asyncio.run(main())) == 8


def test_a_duplicate_request_id_is_refused_and_the_first_runs_on(engine) -> None:
    async def main() -> tuple[list[int], tuple]:
        first = await engine.add_request([1, 2, 3], greedy(6), request_id="same")
        with pytest.raises(ValueError, match="already in use"):
            await engine.add_request([4, 5], greedy(6), request_id="same")
        tokens = [t async for out in first for t in out.outputs[0].token_ids]
        return tokens, await idle_state(engine)

    tokens, state = asyncio.run(main())
    assert len(tokens) == 6 and state == (False, 0.0)


def test_abort_by_id_ends_the_stream(engine) -> None:
    async def main() -> tuple[list, tuple]:
        stream = await engine.add_request([1, 2, 3], greedy(300), request_id="to-abort")
        engine.abort("to-abort")
        outs = [out async for out in stream]  # ends without a finished output
        return outs, await idle_state(engine)

    outs, state = asyncio.run(main())
    assert all(not out.finished for out in outs) and state == (False, 0.0)


def test_call_runs_where_the_engine_runs(engine) -> None:
    where = asyncio.run(engine.call(engine_state.where))
    if isinstance(engine, EngineProcess):
        assert where == (engine.pid, "MainThread") and engine.pid != os.getpid()
    else:
        assert where == (os.getpid(), "roseinfer-engine")


def test_close_ends_open_streams_and_refuses_new_requests(engine) -> None:
    async def main() -> None:
        stream = await engine.add_request([1, 2, 3], greedy(300))
        await asyncio.to_thread(engine.close)
        with pytest.raises(EngineDeadError, match="closed"):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError, match="closed"):
            await engine.add_request([1], greedy(2))

    asyncio.run(main())


@pytest.mark.no_invariant_hook
def test_a_failed_step_fails_every_stream_and_later_requests(engine) -> None:
    async def main() -> None:
        await engine.call(partial(engine_state.fail_step, after=3, message="device fault"))
        streams = [await engine.add_request(p, greedy(50)) for p in PROMPTS[:2]]
        for stream in streams:
            with pytest.raises(EngineDeadError, match="device fault"):
                async for _ in stream:
                    pass
        with pytest.raises(EngineDeadError, match="device fault"):
            await engine.add_request([1], greedy(2))

    asyncio.run(main())
    assert engine.dead is not None
