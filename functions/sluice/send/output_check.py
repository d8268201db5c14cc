"""Targeted resubmission (issue 33): a direct answer that fails the job's checks is sent again, up
to the job's number of sends in all, optionally with what was wrong added as a follow-up turn
("repair"); one still invalid after the last is an `invalid_output` error that keeps its answer.

The engine asks `judge` of each answer where it arrives (no second pass over the output); each send
again goes through the engine's limiter, pacer and budget like any other, so it keeps to the job's
rate limits and cap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

import orjson
from botocore.exceptions import ClientError

from sluice.contract import INBOX_PREFIX, ShardSpec, parse_validate
from sluice.contract.model import ErrorCode, Outcome, Request
from sluice.formats.lines import BOM
from sluice.formats.validation import Validator, schema_problem
from sluice.providers import answers

# the longest schema a job may name: it travels in every shard's spec
MAX_SCHEMA_CHARS = 64 * 1024
# how a validated line ended (`Outcome.validation`, counted in the summary's `validation`)
VALID: Final = "valid_first_time"
REPAIRED: Final = "repaired"
INVALID: Final = "invalid"


class OutputCheck:
    """A direct shard's checks (`validator`), the sends an answer gets in all (`attempts`), and
    whether a send again carries what was wrong (`repair`)."""

    __slots__ = ("attempts", "repair", "validator")

    def __init__(self, validator: Validator, *, attempts: int, repair: bool) -> None:
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        self.validator = validator
        self.attempts = attempts
        self.repair = repair

    @classmethod
    def for_spec(cls, spec: ShardSpec) -> OutputCheck | None:
        """The shard's check; None when its job validates nothing."""
        checks = frozenset(parse_validate(spec.validate))
        if not checks:
            return None
        schema = orjson.loads(spec.validate_schema) if spec.validate_schema else None
        return cls(Validator(checks, schema), attempts=spec.validate_attempts, repair=spec.validate_repair)

    def judge(self, req: Request, outcome: Outcome, failed: list[str]) -> Request | None:
        """The request to send again for the answer `outcome` to `req`, or None when `outcome` is the
        line's last: valid, a failure of another kind, or invalid after the last send (then made an
        `invalid_output` error keeping the answer). `failed`: the checks the line's earlier answers
        failed, which this adds to."""
        if not outcome.ok:
            outcome.failed_checks = tuple(failed)
            return None
        body = orjson.loads(req.body) if req.body else {}
        invalid = self.validator.validate(req.path, body, outcome.body)
        if invalid is None:
            outcome.validation = REPAIRED if failed else VALID
            outcome.failed_checks = tuple(failed)
            return None
        failed.append(invalid.check)
        if len(failed) >= self.attempts:
            sends = "1 send" if len(failed) == 1 else f"{len(failed)} sends"
            outcome.error_code = ErrorCode.INVALID_OUTPUT
            outcome.error_message = f"{invalid.check}: {invalid.message} (after {sends})"
            outcome.validation = INVALID
            outcome.failed_checks = tuple(failed)
            return None
        if not self.repair:
            return req
        read = answers.read(req.path, outcome.body)
        said = read.text if read is not None and read.text is not None else ""
        turn = f"Your answer was not usable: {invalid.message}. Answer again, correctly."
        return replace(req, body=orjson.dumps(answers.repair(req.path, body, said, turn)))

    def give_up(self, outcome: Outcome, failed: list[str], why: str = "the job's budget is spent") -> Outcome:
        """The line's last answer, invalid, when it is not sent again (`why`)."""
        outcome.error_code = ErrorCode.INVALID_OUTPUT
        outcome.error_message = f"{failed[-1]}: not sent again, {why}"
        outcome.validation = INVALID
        outcome.failed_checks = tuple(failed)
        return outcome


class Resends:
    """Answers judged where they arrive outside the engine (a background response's, read by a
    poll): those to send again, each carrying the checks the line's answers failed so far, for a
    direct pass whose engine judges the answers to them as it does a direct line's."""

    __slots__ = ("again", "check", "first")

    def __init__(self, check: OutputCheck) -> None:
        self.check = check
        self.again: list[Request] = []
        # each line's answer that was turned down, its outcome if it is not sent again after all
        self.first: dict[int, Outcome] = {}

    def passes(self, request: Request, outcome: Outcome) -> bool:
        """Whether `outcome` is the line's last: valid, a failure of another kind, or invalid after
        its last send (then an `invalid_output` error); otherwise it is kept to send again."""
        failed = list(request.failed_checks)
        again = self.check.judge(request, outcome, failed)
        if again is None:
            return True
        self.again.append(replace(again, failed_checks=tuple(failed)))
        self.first[outcome.line] = outcome
        return False

    def give_up(self, request: Request, why: str) -> Outcome:
        """The last answer of a line kept to send again that is not sent again (`why`)."""
        return self.check.give_up(self.first[request.line], list(request.failed_checks), why)


def cached_answer_check(checks: tuple[str, ...], schema: str = "") -> Callable[[bytes, bytes], bool] | None:
    """For Plan's cache lookup: whether a cached answer (its response, as JSON) to a request line
    (as read) passes a validating job's `checks`, so that one that fails is sent again rather than
    given; None when the job validates nothing."""
    if not checks:
        return None
    validator = Validator(frozenset(checks), orjson.loads(schema) if schema else None)

    def passes(line: bytes, response: bytes) -> bool:
        request = orjson.loads(line.removeprefix(BOM))
        answer = orjson.loads(response)
        if not isinstance(request, dict) or not isinstance(answer, dict):
            return False
        body = request.get("body")
        path = request.get("url")
        return validator.validate(str(path), body if isinstance(body, dict) else {}, answer.get("body")) is None

    return passes


def read_job_schema(s3: Any, bucket: str, key: str) -> str:
    """The schema a job names (`sluice-validate-schema`: a `.json` object under inbox/ in its
    bucket, which starts no job), read and checked, as canonical JSON; ValueError says what is wrong."""
    if not key.startswith(INBOX_PREFIX) or not key.endswith(".json"):
        raise ValueError(f"expected a .json object under {INBOX_PREFIX} in the job's bucket")
    try:
        raw = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        raise ValueError(f"cannot be read ({exc.response['Error']['Code']})") from exc
    return schema_text(raw)


def schema_text(raw: bytes) -> str:
    """A schema file's content, checked as Plan checks a job's, as canonical JSON; ValueError says
    what is wrong (`sluice run` and `submit` ask before anything starts)."""
    try:
        schema = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from exc
    problem = schema_problem(schema)
    if problem is not None:
        raise ValueError(f"not a JSON schema answers can be checked against: {problem}")
    text = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode()
    if len(text) > MAX_SCHEMA_CHARS:
        raise ValueError(f"{len(text):,} characters, more than the {MAX_SCHEMA_CHARS:,} a job's schema may have")
    return text
