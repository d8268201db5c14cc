"""Bad input: a clear error per line, naming it, and the rest of the file processed."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from sluice_local.cloud import run_job
from tests.conftest import request_line

BODY = {"model": "gpt-4o-mini", "input": "hello"}


def doc(**fields: object) -> bytes:
    base: dict[str, object] = {"custom_id": "x", "method": "POST", "url": "/v1/responses", "body": BODY}
    base.update(fields)
    return orjson.dumps({k: v for k, v in base.items() if v is not None})


def test_every_kind_of_bad_line_is_reported_and_the_rest_runs(make_cloud, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=4)
    rows = [
        b"\xef\xbb\xbf" + request_line("ok-1").rstrip(b"\n") + b"\r\n",  # 1: BOM and CRLF are fine
        b'{"custom_id": "bad-json", "method": \n',  # 2
        doc(custom_id=None) + b"\n",  # 3: no custom_id
        doc(custom_id=42) + b"\n",  # 4: not a string
        request_line("ok-2"),  # 5
        doc(custom_id="ok-1") + b"\n",  # 6: duplicate of line 1
        doc(custom_id="get", method="GET") + b"\n",  # 7
        doc(custom_id="img", url="/v1/images/generations") + b"\n",  # 8
        doc(custom_id="str-body", body="hello") + b"\n",  # 9
        b"   \n",  # 10: blank, not a request
        doc(custom_id="huge", body={"model": "m", "input": "y" * 1_100_000}) + b"\n",  # 11
        b'{"custom_id": "latin1", "body": "caf\xe9"}\n',  # 12
        request_line("ok-3").rstrip(b"\n"),  # 13: no trailing newline
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(rows))
    run = run_job(cloud, path)

    assert run.status == "SUCCEEDED"
    assert run.verify(path).ok, run.verify(path).describe()
    assert [r["custom_id"] for r in run.results] == ["ok-1", "ok-2", "ok-3"]
    errors = {e["line"]: (e["error"]["code"], e["error"]["message"]) for e in run.errors}
    assert {line: code for line, (code, _) in errors.items()} == {
        2: "invalid_json",
        3: "missing_custom_id",
        4: "missing_custom_id",
        6: "duplicate_custom_id",
        7: "invalid_method",
        8: "unsupported_url",
        9: "invalid_body",
        11: "line_too_large",
        12: "invalid_encoding",
    }
    assert all(re.match(rf"line {line}(, column \d+)?: ", message) for line, (_, message) in errors.items())
    # the column within the line, once: not orjson's "line 1 column N" inside a message about line 2
    assert errors[2][1].startswith("line 2, column ") and "line 1" not in errors[2][1]
    assert errors[6][1] == "line 6: duplicate custom_id 'ok-1' (first on line 1)"
    # the line too large to parse still names its request, for users who join on custom_id
    assert next(e["custom_id"] for e in run.errors if e["line"] == 11) == "huge"
    assert run.summary["counts"] == {"lines": 13, "blank": 1, "requests": 12, "results": 3, "errors": 9}


def test_an_empty_file_is_a_job_with_nothing_to_do(make_cloud, tmp_path: Path) -> None:
    cloud = make_cloud()
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    run = run_job(cloud, path)
    assert run.status == "SUCCEEDED"
    assert run.results == [] and run.errors == []
    assert run.summary["counts"]["requests"] == 0


def test_a_file_of_only_invalid_lines_ends_with_every_line_in_errors(make_cloud, simulator, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=3)
    path = tmp_path / "junk.jsonl"
    path.write_bytes(b"".join(b"not json %d\n" % n for n in range(10)))
    run = run_job(cloud, path)
    assert run.status == "SUCCEEDED"
    assert run.verify(path).ok
    assert [e["line"] for e in run.errors] == list(range(1, 11))
    assert not [e for e in simulator.log if e["path"].startswith("/v1/")]
