from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from sluice.contract.model import ErrorCode, Request
from sluice.providers.background import Settled
from sluice.providers.openai.background import output_text, poll_request, settle, submit_request

from sluice_local.cloud import run_job
from tests.conftest import request_line, write_jsonl


def response(status: str, **extra: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status, "output": [], **extra}


def message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


REASONING = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking hard"}]}


def test_submit_adds_background_and_keeps_every_other_field() -> None:
    body = {
        "model": "zai-org/GLM-5.3",
        "input": "Reply with one word",
        "max_output_tokens": 16,
        "max_queue_wait_s": 30,
        "metadata": {"k": "v"},
        "background": False,
    }
    req = Request(line=7, custom_id="c7", method="POST", path="/v1/responses", body=orjson.dumps(body))
    out = submit_request(req)
    assert (out.line, out.custom_id, out.method, out.path) == (7, "c7", "POST", "/v1/responses")
    assert out.body is not None
    assert orjson.loads(out.body) == {**body, "background": True}
    assert req.body == orjson.dumps(body)  # the original is untouched


def test_submit_rejects_non_object_bodies() -> None:
    with pytest.raises(TypeError):
        submit_request(Request(line=1, custom_id="c", method="POST", path="/v1/responses", body=b"[1]"))


def test_poll_request() -> None:
    req = poll_request(3, "c3", "resp_abc")
    assert req == Request(line=3, custom_id="c3", method="GET", path="/v1/responses/resp_abc", body=None)


@pytest.mark.parametrize("status", ["queued", "in_progress", "cancelling"])
def test_pending_statuses_do_not_settle(status: str) -> None:
    assert settle(response(status)) is None


def test_completed_is_a_result() -> None:
    body = response("completed", output=[message("positive")])
    got = settle(body)
    assert got == Settled("completed", body)
    assert got is not None and got.ok


def test_incomplete_with_output_is_a_result_with_its_details() -> None:
    body = response(
        "incomplete",
        output=[REASONING, message("positive")],
        incomplete_details={"reason": "max_output_tokens"},
    )
    got = settle(body)
    assert got is not None and got.ok and got.status == "incomplete"
    assert got.body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_incomplete_with_sdk_output_text_is_a_result() -> None:
    got = settle(response("incomplete", output_text="neg", incomplete_details={"reason": "max_output_tokens"}))
    assert got is not None and got.ok


@pytest.mark.parametrize(
    "output",
    [
        [],
        [REASONING],
        [message("")],
        [{"type": "message", "content": [{"type": "refusal", "refusal": "no"}]}],
        "garbage",
    ],
)
def test_incomplete_without_output_is_an_error_with_the_reason(output: Any) -> None:
    got = settle(response("incomplete", output=output, incomplete_details={"reason": "max_output_tokens"}))
    assert got is not None and not got.ok
    assert got.error_code == ErrorCode.RESPONSE_FAILED
    assert got.error_message is not None and "max_output_tokens" in got.error_message


def test_incomplete_without_details_still_settles() -> None:
    got = settle(response("incomplete", incomplete_details=None))
    assert got is not None and got.error_code == ErrorCode.RESPONSE_FAILED
    assert got.error_message is not None and "unknown" in got.error_message


def test_failed_carries_the_provider_error() -> None:
    got = settle(response("failed", error={"code": "server_error", "message": "model crashed"}))
    assert got is not None and got.error_code == ErrorCode.RESPONSE_FAILED
    assert got.error_message == "server_error: model crashed"


def test_failed_without_error_object() -> None:
    got = settle(response("failed", error=None))
    assert got is not None and got.error_code == ErrorCode.RESPONSE_FAILED and got.error_message


def test_cancelled() -> None:
    got = settle(response("cancelled"))
    assert got is not None and got.error_code == ErrorCode.CANCELLED


def test_unknown_status_surfaces_instead_of_waiting_forever() -> None:
    got = settle({"id": "resp_1"})
    assert got is not None and got.error_code == ErrorCode.RESPONSE_FAILED


def test_output_text_joins_message_parts_and_skips_reasoning() -> None:
    body = response("completed", output=[REASONING, message("a"), {"type": "function_call"}, message("b")])
    assert output_text(body) == "ab"


@pytest.mark.slow
def test_a_background_job_counts_no_retry_without_a_fault_and_times_only_what_came_back_on_its_request(
    make_cloud: Any, tmp_path: Path
) -> None:
    lines = [request_line(f"r-{n}", url="/v1/responses") for n in range(10)]
    lines += [request_line(f"c-{n}") for n in range(10)]
    path = write_jsonl(tmp_path / "mixed.jsonl", lines)

    run = run_job(make_cloud(), path, metadata={"sluice-mode": "background"})

    assert run.status == "SUCCEEDED" and run.verify(path).ok
    assert run.summary["lines_by_path"] == {"background": 10, "direct": 10}
    # a poll is not a send of the line: with no fault, each line was sent once
    assert (run.summary["attempts"], run.summary["retries"]) == (20, 0)
    # the responses were fetched by polls, whose round trip is not the provider's latency
    assert sum(b["count"] for b in run.summary["latency_histogram"]) == 10
