"""Targeted resubmission (`sluice.send.output_check`): which answers are sent again, with what, and how
a line still invalid at the end reads in the errors file and the figures."""

from __future__ import annotations

from typing import Any

import orjson
from sluice.contract import ShardSpec
from sluice.contract.model import ErrorCode, Outcome, Request
from sluice.core.records import outcome_record
from sluice.formats.validation import Validator
from sluice.providers import OPENAI
from sluice.send.output_check import INVALID, REPAIRED, VALID, OutputCheck, cached_answer_check
from sluice.shard.stats import Stats

from tests.unit.helpers.output_check import BODY, SCHEMA, answer

CHAT = "/v1/chat/completions"
REQUEST = Request(1, "c-1", "POST", CHAT, orjson.dumps(BODY))


def check(attempts: int = 3, repair: bool = False) -> OutputCheck:
    return OutputCheck(Validator(frozenset({"json", "schema"})), attempts=attempts, repair=repair)


def test_a_valid_first_answer_is_kept() -> None:
    outcome = answer('{"n": 1}')
    assert check().judge(REQUEST, outcome, []) is None
    assert (outcome.ok, outcome.validation) == (True, VALID)


def test_an_invalid_answer_is_sent_again_as_it_was_without_repair() -> None:
    failed: list[str] = []
    assert check().judge(REQUEST, answer('{"n": "x"}'), failed) is REQUEST
    assert failed == ["schema"]
    outcome = answer('{"n": 2}')
    assert check().judge(REQUEST, outcome, failed) is None
    assert (outcome.validation, outcome.failed_checks) == (REPAIRED, ("schema",))


def test_repair_sends_the_answer_and_what_was_wrong_as_turns() -> None:
    again = check(repair=True).judge(REQUEST, answer('{"n": "x"}'), [])
    assert again is not None and again.line == 1 and again.custom_id == "c-1"
    turns: list[dict[str, Any]] = orjson.loads(again.body or b"")["messages"]
    assert turns[1] == {"role": "assistant", "content": '{"n": "x"}'}
    assert turns[2]["role"] == "user" and "data.n must be integer" in turns[2]["content"]


def test_invalid_after_the_last_send_is_an_invalid_output_error_that_keeps_the_answer() -> None:
    failed = ["json"]
    outcome = answer('{"n": "x"}')
    assert check(attempts=2).judge(REQUEST, outcome, failed) is None
    assert outcome.error_code == ErrorCode.INVALID_OUTPUT
    assert (
        outcome.error_message == "schema: the answer does not match the schema: data.n must be integer (after 2 sends)"
    )
    record = orjson.loads(outcome_record("job", outcome))
    assert record["error"]["check"] == "schema"
    assert record["response"]["body"]["choices"][0]["message"]["content"] == '{"n": "x"}'
    stats = Stats()
    stats.add_outcome(outcome, request_format=OPENAI)
    assert stats.validation == {INVALID: 1, "failed_json": 1, "failed_schema": 1}


def test_a_failure_of_another_kind_is_not_judged() -> None:
    failed = Outcome(1, "c-1", 500, None, None, error_code=ErrorCode.RETRIES_EXHAUSTED)
    assert check().judge(REQUEST, failed, []) is None
    assert failed.error_code == ErrorCode.RETRIES_EXHAUSTED


def test_a_shard_of_a_job_that_validates_nothing_has_no_check() -> None:
    spec = ShardSpec(
        job_id="j", shard=0, bucket="b", key="k", etag="e", start=0, end=1, first_line=1, lines=1,
        mode="direct", concurrency=1, max_attempts=1,
    )  # fmt: skip
    assert OutputCheck.for_spec(spec) is None
    found = OutputCheck.for_spec(ShardSpec(**{**spec.to_item(), "validate": "json,schema", "validate_attempts": 4}))
    assert found is not None and found.attempts == 4 and found.validator.checks == {"json", "schema"}


def test_a_cached_answer_is_given_only_when_it_passes_the_jobs_checks() -> None:
    assert cached_answer_check(()) is None
    passes = cached_answer_check(("json", "schema"))
    assert passes is not None
    line = orjson.dumps({"custom_id": "c-1", "method": "POST", "url": CHAT, "body": BODY})
    for content, kept in (('{"n": 1}', True), ('{"n": "x"}', False), ('{"n"', False)):
        response = orjson.dumps({"status_code": 200, "request_id": "r", "body": answer(content).body})
        assert passes(b"\xef\xbb\xbf" + line, response) is kept


def test_sluice_run_says_how_a_validating_jobs_lines_ended() -> None:
    from sluice_local.run_end import validation_lines

    assert validation_lines({}) == []
    summary = {
        "validation": {"failed_json": 2, "failed_schema": 5, "invalid": 1, "repaired": 6, "valid_first_time": 93}
    }
    assert validation_lines(summary) == [
        "validated: 93 valid first time, 6 repaired, 1 invalid (errors `invalid_output`); "
        "answers turned down: json 2, schema 5"
    ]


class _Bucket:
    """An S3 client that holds a few objects."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects

    def get_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        import io

        from botocore.exceptions import ClientError

        if Key not in self.objects:
            raise ClientError({"Error": {"Code": "NoSuchKey", "Message": "no"}}, "GetObject")
        return {"Body": io.BytesIO(self.objects[Key])}


def test_a_job_names_a_schema_under_inbox_that_plan_reads_and_checks() -> None:
    import pytest
    from sluice.send.output_check import read_job_schema

    bucket = _Bucket({"inbox/s.json": orjson.dumps(SCHEMA), "inbox/bad.json": b"{", "inbox/odd.json": b"[1]"})
    assert orjson.loads(read_job_schema(bucket, "b", "inbox/s.json")) == SCHEMA
    for key, said in (
        ("schemas/s.json", "under inbox/"),
        ("inbox/missing.json", "NoSuchKey"),
        ("inbox/bad.json", "not JSON"),
        ("inbox/odd.json", "a schema is a JSON object"),
    ):
        with pytest.raises(ValueError, match=said):
            read_job_schema(bucket, "b", key)


def test_the_schema_a_job_names_is_checked_on_every_line() -> None:
    spec = ShardSpec(
        job_id="j", shard=0, bucket="b", key="k", etag="e", start=0, end=1, first_line=1, lines=1,
        mode="direct", concurrency=1, max_attempts=1, validate="all", validate_attempts=1,
        validate_schema=orjson.dumps({"type": "object", "required": ["m"]}).decode(),
    )  # fmt: skip
    found = OutputCheck.for_spec(spec)
    assert found is not None
    plain = Request(1, "c-1", "POST", CHAT, orjson.dumps({"model": "m", "messages": []}))
    outcome = answer('{"n": 1}')
    assert found.judge(plain, outcome, []) is None
    assert outcome.error_code == ErrorCode.INVALID_OUTPUT and outcome.failed_checks == ("schema",)


def test_a_run_says_how_many_lines_of_batch_shards_went_direct_and_why() -> None:
    from sluice_local.run_end import batch_direct_lines

    shard = {"lines": 1000, "batch": {"batches": [], "direct_fallback_lines": 0, "requeued": 0}}
    fell = {"lines": 1000, "batch": {"batches": [], "direct_fallback_lines": 40, "requeued": 0}}
    assert batch_direct_lines({"shards": [shard, {"lines": 5, "batch": None}]}) == []
    (line,) = batch_direct_lines({"shards": [shard, fell]})
    assert line.startswith("40 of the 2,000 lines of batch shards went direct, at list price: no batch took them")
