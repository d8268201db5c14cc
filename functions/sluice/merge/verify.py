"""The invariant checker: every input line ends in exactly one of results or errors, in order.

Usable as a library (`verify(...)`) and as `sluice verify INPUT RESULTS ERRORS`. It reads the
three files as streams and keeps one small record per input line, so it checks big jobs too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice.formats.lines import LineError, parse_line

MAX_PROBLEMS = 20


@dataclass
class Report:
    lines: int = 0
    requests: int = 0
    results: int = 0
    errors: int = 0
    problems: list[str] = field(default_factory=list)
    more_problems: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)
        else:
            self.more_problems += 1

    def describe(self) -> str:
        head = f"{self.lines} input lines ({self.requests} requests): {self.results} results, {self.errors} errors"
        if self.ok:
            return f"OK: {head}; every line accounted for exactly once, results in input order"
        more = f"\n  … and {self.more_problems} more" if self.more_problems else ""
        return f"FAILED: {head}\n  " + "\n  ".join(self.problems) + more


def _records(rows: Iterable[bytes], name: str, report: Report) -> Iterable[tuple[int, dict[str, Any]]]:
    for number, raw in enumerate(rows, start=1):
        if not raw.strip():
            continue
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            report.problem(f"{name} line {number}: not JSON ({exc})")
            continue
        if not isinstance(record, dict):
            report.problem(f"{name} line {number}: not a JSON object")
            continue
        yield number, record


def verify(
    input_lines: Iterable[bytes],
    results_lines: Iterable[bytes],
    errors_lines: Iterable[bytes],
    summary: dict[str, Any] | None = None,
) -> Report:
    report = Report()
    # custom_id → input line for valid requests; line → custom_id-or-None for every non-blank line
    by_id: dict[str, int] = {}
    expected: dict[int, str | None] = {}
    for number, raw in enumerate(input_lines, start=1):
        report.lines += 1
        parsed = parse_line(raw, number, keep_body=False)
        if parsed is None:
            continue
        report.requests += 1
        if isinstance(parsed, LineError):
            expected[number] = parsed.custom_id
            continue
        expected[number] = parsed.custom_id
        by_id.setdefault(parsed.custom_id, number)

    seen: dict[int, str] = {}
    last_result_line = 0
    for number, record in _records(results_lines, "results", report):
        report.results += 1
        custom_id = record.get("custom_id")
        line = by_id.get(custom_id) if isinstance(custom_id, str) else None
        if line is None:
            report.problem(f"results line {number}: custom_id {custom_id!r} is not a request in the input")
            continue
        if record.get("error") is not None or not isinstance(record.get("response"), dict):
            report.problem(f"results line {number}: {custom_id!r} has an error or no response")
        if line in seen:
            report.problem(f"results line {number}: {custom_id!r} (input line {line}) already in {seen[line]}")
            continue
        if line < last_result_line:
            report.problem(f"results line {number}: {custom_id!r} (input line {line}) is out of input order")
        last_result_line = max(last_result_line, line)
        seen[line] = "results"

    for number, record in _records(errors_lines, "errors", report):
        report.errors += 1
        error = record.get("error")
        if not isinstance(error, dict) or not error.get("code"):
            report.problem(f"errors line {number}: no error code")
        line = record.get("line")
        custom_id = record.get("custom_id")
        if not isinstance(line, int):
            line = by_id.get(custom_id) if isinstance(custom_id, str) else None
        if line is None or line not in expected:
            report.problem(f"errors line {number}: {custom_id!r} does not name an input line")
            continue
        if line in seen:
            report.problem(f"errors line {number}: input line {line} ({custom_id!r}) already in {seen[line]}")
            continue
        seen[line] = "errors"

    missing = [line for line in expected if line not in seen]
    for line in missing[:MAX_PROBLEMS]:
        report.problem(f"input line {line} ({expected[line]!r}) is in neither results nor errors")
    if len(missing) > MAX_PROBLEMS:
        report.more_problems += len(missing) - MAX_PROBLEMS

    if summary is not None:
        counts = summary.get("counts", {})
        for key, actual in (("results", report.results), ("errors", report.errors), ("requests", report.requests)):
            if key in counts and counts[key] != actual:
                report.problem(f"summary says {counts[key]} {key}, the files hold {actual}")
    return report
