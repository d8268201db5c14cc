"""A shard's run as its runners use it (`ShardRun`), on moto: what it writes for the lines it did not send."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from sluice.contract import Mode
from sluice.contract.model import ErrorCode, Outcome
from sluice.merge.merge import load_manifest
from sluice.send.engine import make_session
from sluice.shard.frame import ShardContext
from sluice.shard.run import ShardRun

from tests.conftest import request_line
from tests.unit.helpers.cancel import BUCKET, Aws
from tests.unit.helpers.sweep import aws as aws


def test_unsent_lines_come_from_what_the_run_read_not_a_second_read_of_the_input(aws: Aws) -> None:
    lines = [request_line("u-1"), request_line("u-2"), b"{not json\n", request_line("u-3"), request_line("u-4")]
    state = aws.plan("inbox/unsent.jsonl", lines)
    (spec,) = load_manifest(aws.s3, BUCKET, state["manifest_key"])
    reads: list[dict[str, Any]] = []
    aws.s3.meta.events.register("before-parameter-build.s3.GetObject", lambda params, **_: reads.append(params))
    outcomes: list[Outcome] = []

    async def go() -> int:
        # no time left: the engine takes no request, and reads one past its stop to know one is left
        ctx = ShardContext(aws.s3, aws.store, aws.settings, "sk-test", lambda: 0.0, make_session)
        run = ShardRun(ctx, spec, path=Mode.DIRECT, item_rows_for_results=False)
        stats = await run.send(run.pending(), outcomes.append, sweep=True)
        assert stats.sent == 0 and stats.stopped_early
        before = [r["Key"] for r in reads]
        written = await run.write_unsent()
        assert [r["Key"] for r in reads] == before, "the input was read again for its unsent lines"
        await run.finish(True)
        return written

    written = asyncio.run(go())

    assert written == 4 and outcomes == []
    raw = aws.s3.get_object(Bucket=BUCKET, Key=spec.errors_key)["Body"].read().splitlines()
    errors = [orjson.loads(row) for row in raw]
    # in input order: the line the engine read past its stop, the rest after it, the invalid line its own
    assert [(e["line"], e["error"]["code"]) for e in errors] == [
        (1, ErrorCode.BUDGET_EXCEEDED),
        (2, ErrorCode.BUDGET_EXCEEDED),
        (3, ErrorCode.INVALID_JSON),
        (4, ErrorCode.BUDGET_EXCEEDED),
        (5, ErrorCode.BUDGET_EXCEEDED),
    ]
    assert [e["custom_id"] for e in errors if e["line"] != 3] == ["u-1", "u-2", "u-3", "u-4"]
