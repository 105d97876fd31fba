"""`roseinfer bench serve --http`: the same W8 requests through the OpenAI server, from a client process, set
beside the in-process rows; a client that fails makes the command fail and says why."""

from __future__ import annotations

import json

import pytest

from roseinfer.bench import serve_http
from roseinfer.entrypoints.cli import main


@pytest.mark.parametrize(
    "engine, where", [("process", "the engine in its own process"), ("thread", "the engine on a thread of")]
)
def test_the_same_requests_through_http_beside_in_process(tmp_path, capsys, engine: str, where: str) -> None:
    path = tmp_path / "serve.json"
    argv = ["bench", "serve", "--num-requests", "5", "--prompt-len", "12", "--output-len", "4", "--rates", "40,inf"]
    argv += ["--warmup-requests", "2", "--no-progress", "--http", "--http-clients", "2", "--json", str(path)]
    assert main([*argv, "--http-engine", engine]) == 0
    out = capsys.readouterr().out
    report = json.loads(path.read_text())
    http = report["http"]["rows"]
    assert [r["rate"] for r in http] == [40.0, float("inf")] == [r["rate"] for r in report["rows"]]
    for row in http:
        assert row["requests"] == 5
        assert row["output_tok_s"] * 5 / row["achieved_req_s"] == pytest.approx(5 * 4)  # every token came back
        assert 0 < row["ttft_p50_ms"] <= row["e2e_p99_ms"] and row["itl_p50_ms"] > 0
        assert row["client_cpu"] > 0 and row["server_cpu"] > 0
        assert (row["engine_cpu"] is not None) == (engine == "process")
    assert f"=== W8 in-process against the same engine through its OpenAI server ({where}" in out
    assert "2 processes of httpx" in out
    assert out.count("        HTTP ") == 2 and out.count("  in-process ") == 2


def test_the_client_stamps_each_chunk_and_counts_its_tokens(monkeypatch) -> None:
    """The client against a scripted stream: tokens per chunk and the finish come from the chunks."""
    import asyncio

    from roseinfer.bench.serve_common import ServeResult

    chunks = [[5, 6], [7], [8]]
    lines = [f'data: {json.dumps({"choices": [{"token_ids": ids, "finish_reason": None if k < 2 else "length"}]})}'
             for k, ids in enumerate(chunks)] + ["data: [DONE]"]  # fmt: skip

    class Response:
        status_code = 200

        async def aiter_lines(self):
            for line in lines:
                yield line

    class Client:
        def stream(self, method, url, json):
            self.body = json

            class Context:
                async def __aenter__(self):
                    return Response()

                async def __aexit__(self, *exc):
                    return False

            return Context()

    result, client = ServeResult(1.0), Client()
    assert asyncio.run(serve_http.send(client, [3, 4, 5], 4, "r0", 0.0, result))
    assert result.output_tokens == 4 and len(result.ttft) == 1 and len(result.itl) == 2
    assert client.body["prompt"] == [3, 4, 5] and client.body["stream"] is True
    assert client.body["max_tokens"] == 4 and client.body["return_token_ids"] is True


def test_a_failing_client_fails_the_command(monkeypatch, capsys) -> None:
    def broken(cmd, path):
        return {"error": f"the vLLM peer exited with 1: {' '.join(cmd[:3])}"}

    monkeypatch.setattr(serve_http, "run_peer_process", broken)
    argv = ["bench", "serve", "--num-requests", "2", "--prompt-len", "8", "--output-len", "2", "--rates", "inf"]
    assert main([*argv, "--warmup-requests", "1", "--no-progress", "--http"]) == 1
    assert "the HTTP client exited with 1" in capsys.readouterr().out
