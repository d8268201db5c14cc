"""The simulator's Gemini Batch API and Files API (`sluice_local.simulator.gemini_batches`,
`gemini_files`): batches of inline requests and of uploaded JSONL files, polled to their end, with
the bad days of the other families' batches (cancel, expiry, partial output, failed rows)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from sluice_local.simulator import SimConfig, SimulatorServer
from sluice_local.simulator.batches import row_tokens
from tests.unit.gemini_wire import MODEL, ask, call, simulator_fixtures

ENDED = {"BATCH_STATE_SUCCEEDED", "BATCH_STATE_FAILED", "BATCH_STATE_CANCELLED", "BATCH_STATE_EXPIRED"}
gemini_server, sim = simulator_fixtures(SimConfig(latency_s=0.0, seed=11, batch_phase_s=0.05))


def inline(count: int) -> dict[str, Any]:
    requests = [{"request": ask(f"question {i}"), "metadata": {"key": f"row-{i}"}} for i in range(count)]
    return {"batch": {"displayName": "inline", "inputConfig": {"requests": {"requests": requests}}}}


def create(sim: SimulatorServer, body: dict[str, Any], *, version: str = "v1beta") -> dict[str, Any]:
    status, _, operation = call(sim, f"/{version}/models/{MODEL}:batchGenerateContent", body)
    assert status == 200, operation
    return operation


def wait(sim: SimulatorServer, name: str, *, version: str = "v1beta") -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status, _, operation = call(sim, f"/{version}/{name}", method="GET")
        assert status == 200, operation
        if operation["metadata"]["state"] in ENDED:
            return operation
        time.sleep(0.02)
    raise AssertionError(f"{name} did not end")


def upload(sim: SimulatorServer, content: bytes, *, chunk: int = 0) -> dict[str, Any]:
    """A file uploaded as Google's SDKs upload it: a resumable start, then chunks to the upload URL."""
    status, headers, _ = call(
        sim,
        "/upload/v1beta/files",
        {"file": {"displayName": "requests.jsonl"}},
        headers={
            "X-Goog-Upload-Protocol": "resumable",
            "X-Goog-Upload-Command": "start",
            "X-Goog-Upload-Header-Content-Length": str(len(content)),
            "X-Goog-Upload-Header-Content-Type": "application/jsonl",
        },
    )
    assert status == 200 and headers["x-goog-upload-status"] == "active"
    url = headers["x-goog-upload-url"].removeprefix(sim.url)
    pieces = [content[i : i + chunk] for i in range(0, len(content), chunk)] if chunk else [content]
    offset = 0
    for index, piece in enumerate(pieces):
        command = "upload, finalize" if index == len(pieces) - 1 else "upload"
        status, headers, answer = call(
            sim,
            url,
            raw=piece,
            key=None,
            headers={"X-Goog-Upload-Command": command, "X-Goog-Upload-Offset": str(offset)},
        )
        assert status == 200, answer
        offset += len(piece)
    assert headers["x-goog-upload-status"] == "final"
    return dict(answer["file"])


def jsonl(count: int) -> bytes:
    lines = [json.dumps({"key": f"line-{i}", "request": ask(f"file question {i}")}) for i in range(count)]
    return ("\n".join(lines) + "\n").encode()


def inlined(operation: dict[str, Any]) -> list[dict[str, Any]]:
    return list(operation["response"]["inlinedResponses"]["inlinedResponses"])


def test_an_inline_batch_is_pending_then_running_then_answers_every_request_in_order(sim: SimulatorServer) -> None:
    operation = create(sim, inline(5))
    assert operation["name"].startswith("batches/") and "done" not in operation
    meta = operation["metadata"]
    assert meta["state"] == "BATCH_STATE_PENDING" and meta["model"] == f"models/{MODEL}"
    assert meta["batchStats"]["requestCount"] == "5"
    ended = wait(sim, operation["name"])
    assert ended["done"] is True and ended["metadata"]["state"] == "BATCH_STATE_SUCCEEDED"
    answers = inlined(ended)
    assert [a["metadata"]["key"] for a in answers] == [f"row-{i}" for i in range(5)]
    assert all(a["response"]["candidates"][0]["finishReason"] == "STOP" for a in answers)
    assert ended["metadata"]["output"]["inlinedResponses"]["inlinedResponses"] == answers
    assert ended["metadata"]["batchStats"]["successfulRequestCount"] == "5"
    assert ended["response"]["@type"].endswith("GenerateContentBatchOutput")


def test_a_file_batch_answers_a_responses_file_keyed_by_line(sim: SimulatorServer) -> None:
    stored = upload(sim, jsonl(6), chunk=100)
    assert stored["name"].startswith("files/") and stored["sizeBytes"] == str(len(jsonl(6)))
    body = {"batch": {"displayName": "file", "inputConfig": {"fileName": stored["name"]}}}
    ended = wait(sim, create(sim, body)["name"])
    assert ended["metadata"]["state"] == "BATCH_STATE_SUCCEEDED"
    responses = ended["response"]["responsesFile"]
    status, _, content = call(sim, f"/download/v1beta/{responses}:download?alt=media", method="GET")
    assert status == 200
    lines = [json.loads(line) for line in content.decode().splitlines()]
    assert sorted(line["key"] for line in lines) == [f"line-{i}" for i in range(6)]
    assert all(line["response"]["candidates"][0]["content"]["parts"][0]["text"] for line in lines)
    # an uploaded file is not for downloading, as on Google's
    status, _, answer = call(sim, f"/download/v1beta/{stored['name']}:download?alt=media", method="GET")
    assert status == 400 and answer["error"]["status"] == "INVALID_ARGUMENT"


def test_a_multipart_upload_stores_the_media_part(sim: SimulatorServer) -> None:
    boundary = "gsimboundary"
    content = jsonl(2)
    body = (
        (
            f"--{boundary}\r\nContent-Type: application/json\r\n\r\n"
            + json.dumps({"file": {"displayName": "multi.jsonl", "mimeType": "application/jsonl"}})
            + f"\r\n--{boundary}\r\nContent-Type: application/jsonl\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    status, _, answer = call(
        sim,
        "/upload/v1beta/files",
        raw=body,
        headers={"X-Goog-Upload-Protocol": "multipart", "Content-Type": f"multipart/related; boundary={boundary}"},
    )
    assert status == 200
    assert answer["file"]["displayName"] == "multi.jsonl" and answer["file"]["sizeBytes"] == str(len(content))
    status, _, described = call(sim, f"/v1beta/{answer['file']['name']}", method="GET")
    assert status == 200 and described["state"] == "ACTIVE" and described["source"] == "UPLOADED"


def test_an_upload_chunk_at_the_wrong_offset_is_refused(sim: SimulatorServer) -> None:
    status, headers, _ = call(
        sim,
        "/upload/v1beta/files",
        {},
        headers={"X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start"},
    )
    url = headers["x-goog-upload-url"].removeprefix(sim.url)
    status, _, answer = call(
        sim, url, raw=b"abc", key=None, headers={"X-Goog-Upload-Command": "upload", "X-Goog-Upload-Offset": "7"}
    )
    assert status == 400 and answer["error"]["status"] == "INVALID_ARGUMENT"


def test_a_cancelled_batch_hands_back_what_it_had_done(sim: SimulatorServer) -> None:
    sim.configure(batch_phase_s=0.4, batch_cancel_s=0.05)
    operation = create(sim, inline(40))
    time.sleep(0.4 + 0.25)  # well into the running phase
    status, _, answer = call(sim, f"/v1beta/{operation['name']}:cancel")
    assert status == 200 and answer == {}
    ended = wait(sim, operation["name"])
    assert ended["metadata"]["state"] == "BATCH_STATE_CANCELLED"
    keys = [a["metadata"]["key"] for a in inlined(ended)]
    assert 0 < len(keys) < 40
    assert ended["metadata"]["batchStats"]["pendingRequestCount"] == str(40 - len(keys))


def test_a_batch_cancelled_on_a_bad_day_hands_back_nothing(sim: SimulatorServer) -> None:
    sim.configure(batch_phase_s=0.4, batch_cancel_s=0.05, batch_cancel_answers="none")
    operation = create(sim, inline(10))
    time.sleep(0.6)
    call(sim, f"/v1beta/{operation['name']}:cancel")
    ended = wait(sim, operation["name"])
    assert ended["metadata"]["state"] == "BATCH_STATE_CANCELLED"
    assert "response" not in ended and "output" not in ended["metadata"]


def test_an_expired_batch_hands_back_part_of_its_answers(sim: SimulatorServer) -> None:
    sim.configure(batch_expire_fraction=1.0, batch_expire_done_fraction=0.5)
    stored = upload(sim, jsonl(40))
    ended = wait(sim, create(sim, {"batch": {"inputConfig": {"fileName": stored["name"]}}})["name"])
    assert ended["metadata"]["state"] == "BATCH_STATE_EXPIRED"
    _, _, content = call(sim, f"/download/v1beta/{ended['response']['responsesFile']}:download", method="GET")
    keys = {json.loads(line)["key"] for line in content.decode().splitlines()}
    assert 5 < len(keys) < 35 and keys <= {f"line-{i}" for i in range(40)}


def test_failed_rows_are_answered_with_their_status(sim: SimulatorServer) -> None:
    body = inline(3)
    body["batch"]["inputConfig"]["requests"]["requests"][1]["request"] = {"messages": []}
    ended = wait(sim, create(sim, body)["name"])
    answers = inlined(ended)
    assert answers[1]["error"]["code"] == 3 and "response" not in answers[1]
    assert "response" in answers[0] and "response" in answers[2]
    assert ended["metadata"]["batchStats"]["failedRequestCount"] == "1"
    sim.configure(batch_row_error_rate=1.0)
    answers = inlined(wait(sim, create(sim, inline(2))["name"]))
    assert [a["error"]["code"] for a in answers] == [13, 13]


def test_a_batch_that_fails_validation_ends_failed_with_its_error(sim: SimulatorServer) -> None:
    stored = upload(sim, jsonl(2) + b"this is not json\n")
    ended = wait(sim, create(sim, {"batch": {"inputConfig": {"fileName": stored["name"]}}})["name"])
    assert ended["metadata"]["state"] == "BATCH_STATE_FAILED"
    assert ended["error"]["code"] == 3 and "Line 3" in ended["error"]["message"]
    sim.configure(batch_validation_error=True)
    assert wait(sim, create(sim, inline(1))["name"])["metadata"]["state"] == "BATCH_STATE_FAILED"


def test_inline_requests_over_the_inline_limit_are_refused(sim: SimulatorServer) -> None:
    sim.configure(gemini_inline_limit=2000)
    status, _, answer = call(sim, f"/v1beta/models/{MODEL}:batchGenerateContent", inline(40))
    assert status == 400 and "exceeds the limit" in answer["error"]["message"]
    create(sim, inline(2))


def test_a_full_batch_queue_is_resource_exhausted(sim: SimulatorServer) -> None:
    # room for one batch of three in a model's queue
    one = sum(row_tokens(item["request"]) for item in inline(3)["batch"]["inputConfig"]["requests"]["requests"])
    sim.configure(batch_queue_limit=one + 10, batch_phase_s=1.0)
    create(sim, inline(3))
    status, _, answer = call(sim, f"/v1beta/models/{MODEL}:batchGenerateContent", inline(3))
    assert status == 429 and answer["error"]["status"] == "RESOURCE_EXHAUSTED"
    # another model's queue is its own
    status, _, _ = call(sim, "/v1beta/models/gemini-2.0-flash:batchGenerateContent", inline(3))
    assert status == 200


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "batch is required"),
        ({"batch": {"inputConfig": {}}}, "exactly one"),
        ({"batch": {"inputConfig": {"requests": {"requests": []}}}}, "at least one"),
        ({"batch": {"input_config": {"requests": {"requests": [{"metadata": {}}]}}}}, "request is required"),
        ({"batch": {"inputs": []}}, 'Unknown name "batch.inputs"'),
    ],
)
def test_a_batch_gemini_refuses_is_a_400(sim: SimulatorServer, body: dict[str, Any], says: str) -> None:
    status, _, answer = call(sim, f"/v1beta/models/{MODEL}:batchGenerateContent", body)
    assert status == 400 and says in answer["error"]["message"]


def test_unknown_batches_and_files_are_answered_as_google_answers_them(sim: SimulatorServer) -> None:
    status, _, answer = call(sim, "/v1beta/batches/nothere", method="GET")
    assert status == 404 and answer["error"]["status"] == "NOT_FOUND"
    status, _, answer = call(sim, "/v1beta/files/nothere", method="GET")
    assert status == 403 and answer["error"]["status"] == "PERMISSION_DENIED"
    body = {"batch": {"inputConfig": {"fileName": "files/nothere"}}}
    status, _, answer = call(sim, f"/v1beta/models/{MODEL}:batchGenerateContent", body)
    assert status == 403


def test_batches_are_listed_and_deleted(sim: SimulatorServer) -> None:
    names = [create(sim, inline(1))["name"] for _ in range(3)]
    status, _, page = call(sim, "/v1beta/batches?pageSize=2", method="GET")
    assert status == 200
    assert [op["name"] for op in page["operations"]] == names[::-1][:2] and page["nextPageToken"]
    _, _, rest = call(sim, f"/v1beta/batches?pageSize=2&pageToken={page['nextPageToken']}", method="GET")
    assert [op["name"] for op in rest["operations"]] == names[:1] and "nextPageToken" not in rest
    assert call(sim, f"/v1beta/{names[0]}", method="DELETE")[:1] == (200,)
    assert call(sim, f"/v1beta/{names[0]}", method="GET")[0] == 404


def test_v1_is_gemini_with_its_key_and_openai_without(sim: SimulatorServer) -> None:
    # newer Google SDKs ask for v1, whose /v1/batches OpenAI's Batch API shares
    operation = create(sim, inline(2), version="v1")
    ended = wait(sim, operation["name"], version="v1")
    assert [a["metadata"]["key"] for a in inlined(ended)] == ["row-0", "row-1"]
    assert call(sim, f"/v1/models/{MODEL}:generateContent", ask("hi"))[0] == 200
    status, _, openai = call(sim, "/v1/batches", method="GET", key=None, headers={"Authorization": "Bearer sk-x"})
    assert status == 200 and openai["object"] == "list"
    status, _, answer = call(sim, f"/v1/models/{MODEL}:generateContent", ask("hi"), key=None)
    assert status == 403 and answer["error"]["status"] == "PERMISSION_DENIED"
