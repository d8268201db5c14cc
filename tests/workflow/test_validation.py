"""Output validation through the whole workflow (issue 33): with the simulator answering off the
schema, with invalid JSON and cut short, a direct job that validates ends with no invalid result,
every invalid answer sent again, every line accounted for and the counts in the summary; with one
send and no repair, the invalid lines are `invalid_output` errors that keep their answers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import orjson
import pytest
from sluice.contract import VALIDATION_CHECKS
from sluice.formats.validation import Validator
from sluice.runners.cancel import open_provider_work
from sluice.store.jobs import JobStore

from sluice_local.cloud import REGION, run_job
from tests.conftest import write_jsonl

LINES = 300
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
SCHEMA = {
    "type": "object",
    "properties": {
        "product": {"type": "string"},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "sentiment": {"enum": ["positive", "neutral", "negative"]},
        "issues": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["product", "rating", "sentiment", "issues"],
    "additionalProperties": False,
}
FAULTS = {"rate_off_schema": 0.1, "rate_invalid_json": 0.05, "rate_truncated": 0.05}
ALL = Validator(frozenset(VALIDATION_CHECKS))


def line(i: int) -> bytes:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": f"Extract the review {i}: the kettle boils fast, lid is loose."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "review", "strict": True, "schema": SCHEMA}},
    }
    return orjson.dumps({"custom_id": f"v-{i}", "method": "POST", "url": CHAT, "body": body}) + b"\n"


def requests_of(path: Path) -> dict[str, Any]:
    return {r["custom_id"]: r["body"] for r in map(orjson.loads, path.read_bytes().splitlines())}


def sends(simulator: Any) -> Counter[str]:
    return Counter(e["custom_id"] for e in simulator.log if e["method"] == "POST" and e["custom_id"])


def test_a_validating_direct_job_sends_invalid_answers_again_until_none_is_left(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    simulator.configure(**FAULTS)
    cloud = make_cloud(shard_lines=100, cache="off")
    path = write_jsonl(tmp_path / "reviews.jsonl", [line(i) for i in range(LINES)])
    run = run_job(cloud, path, metadata={"sluice-validate": "all", "sluice-validate-attempts": "6"})

    assert run.status == "SUCCEEDED"
    assert run.verify(path).ok
    assert run.errors == []
    assert len(run.results) == LINES
    bodies = requests_of(path)
    assert [r for r in run.results if ALL.validate(CHAT, bodies[r["custom_id"]], r["response"]["body"])] == []
    validation = run.summary["validation"]
    assert validation["valid_first_time"] + validation["repaired"] == LINES
    assert validation["repaired"] > 0 and "invalid" not in validation
    turned_down = sum(n for name, n in validation.items() if name.startswith("failed_"))
    assert {name for name in validation if name.startswith("failed_")} == {
        "failed_schema",
        "failed_json",
        "failed_cut_short",
    }
    # every invalid answer was sent again, and nothing else was
    assert sum(sends(simulator).values()) == LINES + turned_down


def test_with_one_send_and_no_repair_invalid_lines_are_errors_that_keep_their_answers(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    simulator.configure(**FAULTS)
    cloud = make_cloud(shard_lines=100, cache="off")
    path = write_jsonl(tmp_path / "once.jsonl", [line(i) for i in range(LINES)])
    metadata = {"sluice-validate": "all", "sluice-validate-attempts": "1", "sluice-validate-repair": "no"}
    run = run_job(cloud, path, metadata=metadata)

    assert run.status in ("SUCCEEDED", "COMPLETED_WITH_ERRORS")
    assert run.verify(path).ok
    assert len(run.results) + len(run.errors) == LINES
    assert run.errors and {e["error"]["code"] for e in run.errors} == {"invalid_output"}
    assert {e["error"]["check"] for e in run.errors} == {"schema", "json", "cut_short"}
    bodies = requests_of(path)
    for error in run.errors:
        found = ALL.validate(CHAT, bodies[error["custom_id"]], error["response"]["body"])
        assert found is not None and found.check == error["error"]["check"]
        assert error["error"]["message"].startswith(f"{found.check}: ")
    assert run.summary["validation"]["invalid"] == len(run.errors)
    assert sum(sends(simulator).values()) == LINES


def test_a_rerun_that_validates_sends_only_the_lines_whose_cached_answers_fail(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    simulator.configure(**FAULTS)
    cloud = make_cloud(shard_lines=100)
    path = write_jsonl(tmp_path / "cached.jsonl", [line(i) for i in range(LINES)])
    first = run_job(cloud, path)
    bodies = requests_of(path)
    failing = {
        r["custom_id"] for r in first.results if ALL.validate(CHAT, bodies[r["custom_id"]], r["response"]["body"])
    }
    # without validation a 200 is a result, and the cache keeps the answers that were not cut short
    assert len(first.results) == LINES and failing

    simulator.clear_log()
    simulator.configure(rate_off_schema=0.0, rate_invalid_json=0.0, rate_truncated=0.0)
    metadata = {"sluice-validate": "all"}
    second = run_job(cloud, path, metadata=metadata, key="inbox/again/cached.jsonl")
    assert second.status == "SUCCEEDED" and second.verify(path).ok
    assert set(sends(simulator)) == failing
    assert second.errors == [] and len(second.results) == LINES
    assert second.summary["cache"]["hits"] == LINES - len(failing)
    assert [r for r in second.results if ALL.validate(CHAT, bodies[r["custom_id"]], r["response"]["body"])] == []


def test_a_validating_batch_job_sends_its_invalid_rows_again_directly(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=100, poll_seconds=1, cache="off")
    simulator.configure(**FAULTS, batch_phase_s=0.1, webhook_url=cloud.webhook_url, webhook_secret=cloud.webhook_secret)
    lines = 200
    path = write_jsonl(tmp_path / "batched.jsonl", [line(i) for i in range(lines)])
    metadata = {"sluice-mode": "batch", "sluice-validate": "all", "sluice-validate-attempts": "6"}
    run = run_job(cloud, path, metadata=metadata)

    assert run.status == "SUCCEEDED"
    assert run.verify(path).ok
    assert run.errors == [] and len(run.results) == lines
    bodies = requests_of(path)
    assert [r for r in run.results if ALL.validate(CHAT, bodies[r["custom_id"]], r["response"]["body"])] == []
    direct = sends(simulator)
    turned_down = run.summary["validation"]
    assert direct and turned_down["failed_schema"] and turned_down["failed_json"] and turned_down["failed_cut_short"]
    # each answer turned down, in a batch or directly, was sent again directly once, and nothing else was
    assert sum(direct.values()) == sum(n for name, n in turned_down.items() if name.startswith("failed_"))
    # every line answered counts once, and a row a batch turned down that then passed is repaired
    assert turned_down["valid_first_time"] + turned_down["repaired"] + turned_down.get("invalid", 0) == lines
    assert turned_down["repaired"] == len(direct)


def test_a_batch_job_that_reports_what_batches_leave_reports_invalid_rows_as_invalid_output(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=100, poll_seconds=1, cache="off")
    simulator.configure(**FAULTS, batch_phase_s=0.1, webhook_url=cloud.webhook_url, webhook_secret=cloud.webhook_secret)
    path = write_jsonl(tmp_path / "reported.jsonl", [line(i) for i in range(100)])
    metadata = {"sluice-mode": "batch", "sluice-validate": "all", "sluice-on-batch-incomplete": "error"}
    run = run_job(cloud, path, metadata=metadata)

    assert run.verify(path).ok
    assert len(run.results) + len(run.errors) == 100 and run.errors
    assert {e["error"]["code"] for e in run.errors} == {"invalid_output"}
    assert all("on-batch-incomplete: error" in e["error"]["message"] for e in run.errors)
    assert sends(simulator) == Counter()


def responses_line(i: int) -> bytes:
    body = {
        "model": "gpt-4o-mini",
        "input": f"Extract the review {i}: the kettle boils fast, lid is loose.",
        "text": {"format": {"type": "json_schema", "name": "review", "strict": True, "schema": SCHEMA}},
    }
    return orjson.dumps({"custom_id": f"bg-{i}", "method": "POST", "url": RESPONSES, "body": body}) + b"\n"


def test_a_validating_background_job_sends_invalid_answers_again_directly_until_none_is_left(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    simulator.configure(**FAULTS, latency_s=0.05)
    cloud = make_cloud(shard_lines=100, poll_seconds=1, cache="off")
    lines = 200
    path = write_jsonl(tmp_path / "background.jsonl", [responses_line(i) for i in range(lines)])
    metadata = {"sluice-mode": "background", "sluice-validate": "all", "sluice-validate-attempts": "6"}
    run = run_job(cloud, path, metadata=metadata)

    assert run.status == "SUCCEEDED"
    assert run.verify(path).ok
    assert run.errors == [] and len(run.results) == lines
    bodies = requests_of(path)
    assert [r for r in run.results if ALL.validate(RESPONSES, bodies[r["custom_id"]], r["response"]["body"])] == []
    validation = run.summary["validation"]
    assert validation["valid_first_time"] + validation["repaired"] == lines
    assert validation["repaired"] > 0 and "invalid" not in validation
    turned_down = sum(n for name, n in validation.items() if name.startswith("failed_"))
    assert turned_down >= validation["repaired"]
    created = Counter(
        e["custom_id"] for e in simulator.log if e["method"] == "POST" and e["path"] == RESPONSES and e["custom_id"]
    )
    # each line's background response was created once; every answer turned down was sent again, and nothing else
    assert len(created) == lines
    assert sum(created.values()) == lines + turned_down
    # a line whose answer came from a send again is done: no item is left looking open to a cancel
    store = JobStore(boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name), ttl_days=1)
    assert open_provider_work(store, run.job_id).responses == []


def test_a_schema_the_job_names_is_read_by_plan_and_every_answer_checked_against_it(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=100, cache="off")
    schema = tmp_path / "needs-rating.json"
    schema.write_bytes(orjson.dumps({"type": "object", "required": ["rating"]}))
    cloud.upload(schema, key="inbox/schemas/needs-rating.json")
    bodies = [
        {
            "model": "m",
            "messages": [{"role": "user", "content": f"rate {i}"}],
            "response_format": {"type": "json_object"},
        }
        for i in range(20)
    ]
    rows = [
        orjson.dumps({"custom_id": f"s-{i}", "method": "POST", "url": CHAT, "body": b}) + b"\n"
        for i, b in enumerate(bodies)
    ]
    path = write_jsonl(tmp_path / "named.jsonl", rows)
    metadata = {
        "sluice-validate": "all",
        "sluice-validate-attempts": "1",
        "sluice-validate-schema": "inbox/schemas/needs-rating.json",
    }
    run = run_job(cloud, path, metadata=metadata)

    assert run.verify(path).ok and run.results == []
    assert {(e["error"]["code"], e["error"]["check"]) for e in run.errors} == {("invalid_output", "schema")}
    assert all("must contain ['rating'] properties" in e["error"]["message"] for e in run.errors)


MESSAGES = "/v1/messages"
CLAUDE = "anthropic.claude-3-haiku-20240307-v1:0"


def messages_line(i: int, model: str) -> bytes:
    body = {
        "model": model,
        "max_tokens": 400,
        "messages": [{"role": "user", "content": f"Extract the review {i}: the kettle boils fast, lid is loose."}],
        "output_format": {"type": "json_schema", "schema": SCHEMA},
    }
    return orjson.dumps({"custom_id": f"m-{i}", "method": "POST", "url": MESSAGES, "body": body}) + b"\n"


def chat_line(i: int, model: str) -> bytes:
    body = {"model": model, "max_tokens": 50, "messages": [{"role": "user", "content": f"Summarise review {i}."}]}
    return orjson.dumps({"custom_id": f"c-{i}", "method": "POST", "url": CHAT, "body": body}) + b"\n"


@pytest.mark.parametrize(
    ("provider", "model"), [("anthropic", "claude-3-5-haiku-latest"), ("bedrock", CLAUDE)], ids=["anthropic", "bedrock"]
)
def test_a_validating_job_on_anthropic_or_bedrock_ends_with_no_invalid_result(
    make_cloud: Any, simulator: Any, tmp_path: Path, provider: str, model: str
) -> None:
    simulator.configure(**FAULTS, rate_refusal=0.05)
    metadata = {"sluice-validate": "all", "sluice-validate-attempts": "8"}
    # Bedrock states no limits in its headers: the configured quota of the model paces the job
    quota = orjson.dumps({CLAUDE: {"rpm": 60000, "tpm": 10_000_000}}).decode()
    settings = {"rate_limits": quota} if provider == "bedrock" else {}
    cloud = make_cloud(provider=provider, shard_lines=100, cache="off", **settings)
    # on Bedrock the Messages lines go to InvokeModel and the chat lines to Converse
    rows = [messages_line(i, model) for i in range(100)] + [chat_line(i, model) for i in range(100)]
    path = write_jsonl(tmp_path / f"{provider}.jsonl", rows)
    run = run_job(cloud, path, metadata=metadata)

    assert run.status == "SUCCEEDED"
    bodies = {r["custom_id"]: (r["url"], r["body"]) for r in map(orjson.loads, path.read_bytes().splitlines())}
    # every line accounted for once (`verify` reads lines as OpenAI takes them, which have no Messages path)
    assert run.errors == [] and sorted(r["custom_id"] for r in run.results) == sorted(bodies)
    assert [r for r in run.results if ALL.validate(*bodies[r["custom_id"]], r["response"]["body"])] == []
    validation = run.summary["validation"]
    assert validation["valid_first_time"] + validation["repaired"] == len(rows)
    failed = {name for name in validation if name.startswith("failed_")}
    assert failed == {"failed_schema", "failed_json", "failed_cut_short", "failed_refusal"}
    # the chat lines' answers were spoiled too (on Bedrock, Converse's), and sent again
    assert [cid for cid, n in sends(simulator).items() if cid.startswith("c-") and n > 1]


@pytest.mark.parametrize(
    ("provider", "model"), [("anthropic", "claude-3-5-haiku-latest"), ("bedrock", CLAUDE)], ids=["anthropic", "bedrock"]
)
def test_a_validating_batch_job_on_anthropic_or_bedrock_sends_its_invalid_rows_again(
    make_cloud: Any, simulator: Any, tmp_path: Path, provider: str, model: str
) -> None:
    quota = orjson.dumps({CLAUDE: {"rpm": 60000, "tpm": 10_000_000}}).decode()
    settings = {"rate_limits": quota} if provider == "bedrock" else {}
    # a Bedrock job takes 100 records at least, and a file holds one endpoint: 100 lines of each
    cloud = make_cloud(provider=provider, shard_lines=200, poll_seconds=1, cache="off", **settings)
    simulator.configure(**FAULTS, rate_refusal=0.05, batch_phase_s=0.1)
    if cloud.bedrock_jobs is not None:
        cloud.bedrock_jobs.output_faults = lambda: simulator.config
    rows = [messages_line(i, model) for i in range(100)] + [chat_line(i, model) for i in range(100)]
    path = write_jsonl(tmp_path / f"{provider}-batch.jsonl", rows)
    metadata = {"sluice-mode": "batch", "sluice-validate": "all", "sluice-validate-attempts": "8"}
    run = run_job(cloud, path, metadata=metadata)

    assert run.status == "SUCCEEDED"
    bodies = {r["custom_id"]: (r["url"], r["body"]) for r in map(orjson.loads, path.read_bytes().splitlines())}
    assert run.errors == [] and sorted(r["custom_id"] for r in run.results) == sorted(bodies)
    assert [r for r in run.results if ALL.validate(*bodies[r["custom_id"]], r["response"]["body"])] == []
    validation = run.summary["validation"]
    direct = sends(simulator)
    # the rows the batch turned down were sent again directly, and each that then passed counts as repaired
    assert direct and validation["repaired"] == len(direct)
    assert validation["valid_first_time"] + validation["repaired"] == len(rows)
    assert {name for name in validation if name.startswith("failed_")} == {
        "failed_schema",
        "failed_json",
        "failed_cut_short",
        "failed_refusal",
    }
