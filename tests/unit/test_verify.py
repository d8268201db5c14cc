import orjson
from sluice.merge.verify import verify


def req(cid: str) -> bytes:
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}) + b"\n"


def ok(cid: str) -> bytes:
    return (
        orjson.dumps({"id": "x", "custom_id": cid, "response": {"status_code": 200, "body": {}}, "error": None}) + b"\n"
    )


def err(cid: str | None, line: int, code: str = "provider_error") -> bytes:
    record = {"custom_id": cid, "response": None, "error": {"code": code, "message": "m"}, "line": line}
    return orjson.dumps(record) + b"\n"


INPUT = [req("a"), b"{broken\n", req("b"), b"\n", req("a"), req("c")]


def test_a_complete_job_passes() -> None:
    report = verify(
        INPUT,
        [ok("a"), ok("c")],
        [err(None, 2, "invalid_json"), err("b", 3), err("a", 5, "duplicate_custom_id")],
        {"counts": {"results": 2, "errors": 3, "requests": 5}},
    )
    assert report.ok, report.describe()
    assert (report.lines, report.requests, report.results, report.errors) == (6, 5, 2, 3)


def test_each_breach_is_explained() -> None:
    report = verify(INPUT, [ok("c"), ok("a"), ok("a"), ok("zz")], [err(None, 2)], {"counts": {"results": 9}})
    text = report.describe()
    assert not report.ok
    assert "out of input order" in text
    assert "already in results" in text
    assert "'zz' is not a request in the input" in text
    assert "input line 3 ('b') is in neither results nor errors" in text
    assert "input line 5 ('a') is in neither results nor errors" in text
    assert "summary says 9 results, the files hold 4" in text


def test_a_line_in_both_files_is_a_breach() -> None:
    report = verify([req("a")], [ok("a")], [err("a", 1)])
    assert "input line 1 ('a') already in results" in report.describe()
