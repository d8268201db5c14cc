"""bench/gemini_server.py, the Gemini-compatible server written from Google's REST reference: it
answers generateContent in its own words, refuses what Google refuses, and imports nothing of Sluice."""

from __future__ import annotations

import ast
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bench.gemini_server import ANSWER_PREFIX, GeminiServer, Running

SOURCE = Path(__file__).resolve().parents[2] / "bench" / "gemini_server.py"


@pytest.fixture
def server() -> Iterator[GeminiServer]:
    with Running(GeminiServer(key="AIza-own", throttle_every=0)) as running:
        yield running


def post(server: GeminiServer, body: Any, *, key: str | None = "AIza-own", version: str = "v1beta") -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **({"x-goog-api-key": key} if key else {})}
    url = f"{server.base_url}/{version}/models/gemini-2.5-flash:generateContent"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def chat(text: str) -> dict[str, Any]:
    return {
        "systemInstruction": {"parts": [{"text": "Answer briefly."}]},
        "contents": [{"role": "user", "parts": [{"text": text}]}],
        "generationConfig": {"maxOutputTokens": 20, "temperature": 0},
    }


def test_it_imports_nothing_of_sluice() -> None:
    imported: set[str] = set()
    for node in ast.walk(ast.parse(SOURCE.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"sluice", "local", "functions", "sluice_handlers", "infra", "bench", "tests"}


def test_it_answers_three_hundred_requests_in_its_own_words(server: GeminiServer) -> None:
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda n: post(server, chat(f"review number {n}")), range(300)))
    assert {status for status, _ in answers} == {200}
    texts = [body["candidates"][0]["content"]["parts"][0]["text"] for _, body in answers]
    assert all(text.startswith(ANSWER_PREFIX) for text in texts) and len(set(texts)) == 300
    usage = answers[0][1]["usageMetadata"]
    assert usage["totalTokenCount"] == usage["promptTokenCount"] + usage["candidatesTokenCount"]
    assert server.answered == 300 and server.models == {"gemini-2.5-flash": 300}
    assert list(server.key_digests.values()) == [300] and "AIza-own" not in str(server.key_digests)


def test_it_lists_its_models_to_a_caller_with_its_key(server: GeminiServer) -> None:
    request = urllib.request.Request(f"{server.base_url}/v1beta/models", headers={"x-goog-api-key": "AIza-own"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert "models/gemini-2.5-flash" in [m["name"] for m in json.loads(answer.read())["models"]]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{server.base_url}/v1beta/models", timeout=10)
    assert refused.value.code == 403


def test_it_refuses_as_google_does(server: GeminiServer) -> None:
    status, body = post(server, {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT" and "messages" in body["error"]["message"]
    status, body = post(server, {"contents": [{"role": "assistant", "parts": [{"text": "hi"}]}]})
    assert status == 400 and "valid role" in body["error"]["message"]
    status, body = post(server, chat("hi"), key=None)
    assert status == 403 and body["error"]["status"] == "PERMISSION_DENIED"
    status, body = post(server, chat("hi"), key="AIza-someone-else")
    assert status == 400 and body["error"]["details"][0]["reason"] == "API_KEY_INVALID"
    assert (
        post(
            server,
            {"contents": [{"parts": [{"text": "hi"}]}], "generation_config": {"max_output_tokens": 3}},
            version="v1",
        )[0]
        == 200
    )
    assert server.refused == {"INVALID_ARGUMENT": 3, "PERMISSION_DENIED": 1}


def test_its_quota_is_resource_exhausted_with_a_retry_delay() -> None:
    with Running(GeminiServer(throttle_every=3, retry_delay_s=2)) as server:
        answers = [post(server, chat(f"q{n}"), key="any") for n in range(6)]
    assert [status for status, _ in answers] == [200, 200, 429, 200, 200, 429]
    error = answers[2][1]["error"]
    assert error["status"] == "RESOURCE_EXHAUSTED"
    assert error["details"] == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2s"}]
