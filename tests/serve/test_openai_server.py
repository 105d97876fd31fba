"""The OpenAI-compatible server (`roseinfer serve`) through FastAPI's test client, on a tiny random Llama with a
locally trained tokenizer (ChatML template): each endpoint's body and streamed chunks against the offline
engine's output for the same request, and every refusal's status and message."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from roseinfer import LLM, SamplingParams
from roseinfer.engine.async_engine import AsyncLLMEngine
from roseinfer.engine.engine_process import EngineProcess
from roseinfer.entrypoints.openai.api_server import build_app
from tests.serve import engine_state

NAME = "tiny-chat"


@pytest.fixture(scope="module")
def reference(model_with_tokenizer: str) -> LLM:
    """The same model in an engine of its own: the served one belongs to its engine thread."""
    return LLM(model_with_tokenizer, device="cpu", block_size=4, num_kv_blocks=256)


@pytest.fixture(scope="module", params=["process", "thread"])
def client(request, model_with_tokenizer: str) -> Iterator[TestClient]:
    """The server over the engine in a process of its own (`roseinfer serve`'s default), or on a thread."""
    kwargs = {"device": "cpu", "block_size": 4, "num_kv_blocks": 256}
    if request.param == "process":
        engine: EngineProcess | AsyncLLMEngine = EngineProcess(model_with_tokenizer, **kwargs)
    else:
        engine = AsyncLLMEngine(LLM(model_with_tokenizer, **kwargs).engine)
    with TestClient(build_app(engine, NAME)) as test_client:
        yield test_client
    engine.close()


def offline(llm: LLM, prompt, **params) -> list:
    return llm.generate([prompt], SamplingParams(**params), use_tqdm=False)[0].outputs


def events(client: TestClient, path: str, body: dict) -> list:
    """The stream's events, parsed; the last must be [DONE]."""
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


def idle(client: TestClient, wait: float = 5.0) -> bool:
    """Whether the engine holds no request and no block, read where it runs, within `wait` seconds (an abort
    reaches the engine after the response, and an aborted step may still be in flight)."""
    engine = client.app.state.engine
    deadline = time.monotonic() + wait
    while (state := asyncio.run(engine.call(engine_state.load)))["busy"] or state["usage"]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_models_health_version(client: TestClient, reference: LLM) -> None:
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [NAME]
    assert models["data"][0]["max_model_len"] == reference.engine.config.max_model_len
    assert client.get("/health").status_code == 200
    assert client.get("/version").json()["version"]


def test_completion_matches_the_offline_engine(client: TestClient, reference: LLM) -> None:
    body = {"model": NAME, "prompt": "Hello world", "max_tokens": 7, "temperature": 0, "ignore_eos": True}
    got = client.post("/v1/completions", json=body).json()
    want = offline(reference, "Hello world", max_tokens=7, temperature=0, ignore_eos=True)[0]
    assert got["object"] == "text_completion" and got["model"] == NAME
    assert got["choices"][0]["text"] == want.text
    assert got["choices"][0]["finish_reason"] == "length"
    prompt_len = len(reference.tokenizer("Hello world")["input_ids"])
    assert got["usage"]["prompt_tokens"] == prompt_len
    assert got["usage"]["completion_tokens"] == 7 and got["usage"]["total_tokens"] == prompt_len + 7
    assert idle(client)


def test_streamed_completion_adds_up_to_the_whole(client: TestClient, reference: LLM) -> None:
    body = {"prompt": [40, 41, 42], "max_tokens": 9, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}  # fmt: skip
    chunks = events(client, "/v1/completions", body)
    *deltas, last = chunks
    want = offline(reference, [40, 41, 42], max_tokens=9, temperature=0, ignore_eos=True)[0]
    assert "".join(c["choices"][0]["text"] for c in deltas) == want.text
    assert [t for c in deltas for t in c["choices"][0]["token_ids"]] == want.token_ids
    assert deltas[0]["choices"][0]["prompt_token_ids"] == [40, 41, 42]
    assert "prompt_token_ids" not in deltas[-1]["choices"][0]
    assert [c["choices"][0]["finish_reason"] for c in deltas][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in deltas[:-1])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 9
    assert len({c["id"] for c in chunks}) == 1


def test_several_prompts_and_n_index_choices_as_openai(client: TestClient, reference: LLM) -> None:
    prompts = [[40, 41], [50, 51, 52]]
    body = {"prompt": prompts, "n": 2, "max_tokens": 4, "temperature": 0.8, "seed": 3, "ignore_eos": True}
    got = client.post("/v1/completions", json=body).json()
    assert [c["index"] for c in got["choices"]] == [0, 1, 2, 3]
    want = [o.token_ids for p in prompts for o in offline(reference, p, n=2, max_tokens=4, temperature=0.8, seed=3,
                                                          ignore_eos=True)]  # fmt: skip
    body["return_token_ids"] = True
    assert [c["token_ids"] for c in client.post("/v1/completions", json=body).json()["choices"]] == want
    streamed = events(client, "/v1/completions", {**body, "stream": True})
    by_index: dict[int, list[int]] = {}
    for chunk in streamed:
        for choice in chunk["choices"]:
            by_index.setdefault(choice["index"], []).extend(choice["token_ids"])
    assert [by_index[i] for i in range(4)] == want
    assert got["usage"]["prompt_tokens"] == 5 and got["usage"]["completion_tokens"] == 16


def test_stop_string_and_logprobs(client: TestClient, reference: LLM) -> None:
    base = offline(reference, [40, 41, 42], max_tokens=12, temperature=0, ignore_eos=True)[0]
    stop = base.text[3:5]
    assert stop, "the greedy text is too short to cut"
    body = {"prompt": [40, 41, 42], "max_tokens": 12, "temperature": 0, "ignore_eos": True, "stop": [stop],
            "logprobs": 2}  # fmt: skip
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    want = offline(reference, [40, 41, 42], max_tokens=12, temperature=0, ignore_eos=True, stop=[stop], logprobs=2)[0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (want.text, "stop", stop)
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(want.token_ids) == len(logprobs["token_logprobs"])
    assert logprobs["token_logprobs"] == pytest.approx([p[t].logprob for t, p in zip(want.token_ids, want.logprobs)])
    assert all(2 <= len(top) <= 3 for top in logprobs["top_logprobs"])
    assert logprobs["text_offset"][0] == 0 and logprobs["text_offset"] == sorted(logprobs["text_offset"])


def test_chat_matches_the_offline_chat(client: TestClient, reference: LLM) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How are you?"}]
    body = {"model": NAME, "messages": messages, "max_completion_tokens": 8, "temperature": 0, "ignore_eos": True}
    got = client.post("/v1/chat/completions", json=body).json()
    want = reference.chat(messages, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)[0]
    assert got["object"] == "chat.completion"
    assert got["choices"][0]["message"] == {"role": "assistant", "content": want.outputs[0].text}
    assert got["usage"]["prompt_tokens"] == len(want.prompt_token_ids)
    chunks = events(client, "/v1/chat/completions", {**body, "stream": True})
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:])
    assert text == want.outputs[0].text and chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_parts_and_logprobs(client: TestClient, reference: LLM) -> None:
    parts = [{"type": "text", "text": "How are"}, {"type": "text", "text": "you?"}]
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 5, "temperature": 0,
            "ignore_eos": True, "logprobs": True, "top_logprobs": 3}  # fmt: skip
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    want = reference.chat([{"role": "user", "content": "How are\nyou?"}], SamplingParams(max_tokens=5, temperature=0,
                    ignore_eos=True), use_tqdm=False)[0].outputs[0]  # fmt: skip
    assert choice["message"]["content"] == want.text
    content = choice["logprobs"]["content"]
    assert len(content) == 5 and all(len(c["top_logprobs"]) == 3 for c in content)
    assert all(c["top_logprobs"][0]["logprob"] >= c["top_logprobs"][-1]["logprob"] for c in content)
    assert all(c["bytes"] == list(c["token"].encode()) for c in content)


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("/v1/completions", {"prompt": [1, 2], "temperature": -1}, 400, "temperature must be >= 0"),
        ("/v1/completions", {"prompt": [1, 2], "n": "two"}, 400, "n: Input should be a valid integer"),
        ("/v1/completions", {"prompt": [1, 2], "max_tokens": 10**6}, 400, "max_model_len"),
        ("/v1/completions", {"prompt": [[1, 2], [1, 10**7]]}, 400, "prompt 1: "),
        ("/v1/completions", {"prompt": []}, 400, "prompt must not be empty"),
        ("/v1/completions", {"prompt": "hi", "echo": True}, 400, "echo is not supported"),
        ("/v1/completions", {"prompt": "hi", "best_of": 3}, 400, "best_of (3)"),
        ("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
        ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "The model `gpt-4` does not exist"),
        ("/v1/completions", {"max_tokens": 3}, 400, "prompt: Field required"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages: List should have at least 1 item"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
         400, "tools are not supported"),  # fmt: skip
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
         "['image_url'] are not supported"),  # fmt: skip
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400,
         "top_logprobs needs logprobs=true"),  # fmt: skip
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                  "response_format": {"type": "json_object"}}, 400, "'json_object'"),  # fmt: skip
    ],
)
def test_refusals_in_openai_shape(client: TestClient, path: str, body: dict, status: int, message: str) -> None:
    response = client.post(path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert message in error["message"] and error["code"] == status
    assert error["type"] == {400: "BadRequestError", 404: "NotFoundError"}[status]
    assert idle(client)  # a refused request leaves nothing queued, the good prompts of a mixed one included


def test_unknown_fields_are_ignored(client: TestClient) -> None:
    body = {"prompt": [1, 2], "max_tokens": 2, "user": "u1", "store": False, "metadata": {"a": "b"}}
    assert client.post("/v1/completions", json=body).status_code == 200


def test_metrics_in_prometheus_text(client: TestClient) -> None:
    client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2, "ignore_eos": True})
    text = client.get("/metrics").text
    lines = dict(line.rsplit(" ", 1) for line in text.strip().splitlines())
    assert float(lines["roseinfer_generation_tokens_total"]) >= 2
    assert 'roseinfer_request_success_total{finished_reason="length"}' in lines
    assert lines["roseinfer_num_requests_running"] == "0.0"


@pytest.mark.parametrize("mode", [[], ["--engine-thread"]], ids=["engine-process", "engine-thread"])
def test_the_serve_command_serves_the_named_model_and_closes_its_engine(monkeypatch, capsys, mode) -> None:
    import uvicorn

    from roseinfer.engine.request_stream import EngineDeadError
    from roseinfer.entrypoints.cli import main

    seen: dict = {}

    def fake_run(app, host: str, port: int, log_level: str, access_log: bool) -> None:
        with TestClient(app) as test_client:
            seen["models"] = test_client.get("/v1/models").json()
            body = {"model": "mine", "prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": True}
            seen["completion"] = test_client.post("/v1/completions", json=body).json()
        seen["engine"], seen["where"] = app.state.engine, (host, port, log_level, access_log)

    monkeypatch.setattr(uvicorn, "run", fake_run)
    argv = ["serve", "--served-model-name", "mine", "--port", "8123", "--device", "cpu", "--num-kv-blocks", "64"]
    assert main([*argv, *mode]) == 0
    assert [m["id"] for m in seen["models"]["data"]] == ["mine"]
    assert seen["completion"]["usage"]["completion_tokens"] == 3
    assert seen["where"] == ("127.0.0.1", 8123, "info", False)
    with pytest.raises(EngineDeadError, match="closed"):  # closed when the server stopped
        asyncio.run(seen["engine"].add_request([1, 2], SamplingParams(max_tokens=2)))
    assert "serving 'mine' on http://127.0.0.1:8123/v1" in capsys.readouterr().err


def test_the_serve_command_names_a_missing_http_package(monkeypatch, capsys) -> None:
    import builtins

    from roseinfer.entrypoints.cli import main

    real_import = builtins.__import__

    def no_uvicorn(name, *args, **kwargs):
        if name == "uvicorn":
            raise ImportError("No module named 'uvicorn'", name="uvicorn")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvicorn)
    assert main(["serve"]) == 2
    assert 'uvicorn is missing): pip install -e ".[serve]"' in capsys.readouterr().err


def test_tokenize_and_detokenize_as_vllm(client: TestClient, reference: LLM) -> None:
    text = "Hello world! How are you?"
    got = client.post("/tokenize", json={"prompt": text}).json()
    assert got["tokens"] == reference.tokenizer.encode(text) and got["count"] == len(got["tokens"])
    assert got["max_model_len"] == reference.engine.config.max_model_len
    assert client.post("/detokenize", json={"tokens": got["tokens"]}).json() == {"prompt": text}
    messages = [{"role": "user", "content": "How are you?"}]
    chat = client.post("/tokenize", json={"messages": messages}).json()
    assert chat["tokens"] == reference.chat(messages, SamplingParams(max_tokens=1), use_tqdm=False)[0].prompt_token_ids
    for path, body, message in [
        ("/tokenize", {"prompt": "a", "messages": messages}, "either prompt"),
        ("/tokenize", {"prompt": "a", "model": "other"}, "does not exist"),
        ("/detokenize", {"tokens": [1, 10**9]}, "outside the vocabulary"),
    ]:
        response = client.post(path, json=body)
        assert response.status_code in (400, 404) and message in response.json()["error"]["message"]
