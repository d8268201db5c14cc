"""Every AWS call in the core runs under a cause its code declares, read from the code without a
run (`bench/scale/undeclared.py`): a call planted outside any cause fails, in any branch."""

from __future__ import annotations

from pathlib import Path

import pytest
from sluice.contract import causes

from bench.scale import undeclared

PARTS = "functions/sluice/shard/parts.py"
ENGINE = "functions/sluice/send/engine.py"
ADD_OUTCOME = '        chunk = self._chunk\n        kind = b"r" if outcome.ok else b"e"\n'
# a write a line, in a branch only a rare outcome takes: no counted run would meet it
PLANTED = "        if outcome.line < 0:\n            self._s3.put_object(Bucket='b', Key='k', Body=b'')\n"


def _source(path: str) -> str:
    return (undeclared.ROOT / path).read_text()


def _planted(path: str, anchor: str, planted: str) -> list[undeclared.Undeclared]:
    source = _source(path)
    assert source.count(anchor) == 1, f"{path} changed: plant the call somewhere else"
    return undeclared.undeclared(undeclared.modules(replaced={path: source.replace(anchor, planted + anchor)}))


@pytest.fixture(scope="module")
def core() -> list[undeclared.Undeclared]:
    return undeclared.undeclared(undeclared.modules())


@pytest.mark.slow
def test_every_aws_call_in_the_core_is_under_a_declared_cause(core: list[undeclared.Undeclared]) -> None:
    assert core == [], "\n".join(u.line() for u in core)


def test_a_boto3_call_planted_outside_any_cause_fails_the_check() -> None:
    found = _planted(PARTS, ADD_OUTCOME, PLANTED)
    assert found, "a put_object a line outside any cause passed"
    [planted] = [u for u in found if "add_outcome (put_object)" in u.where]
    assert planted.where.startswith(PARTS)
    # the chain starts at the function that makes it: nothing on the way up declares a cause
    assert planted.chain[0] == f"{PARTS}:218 add_outcome"


def test_the_same_call_under_a_declared_cause_passes() -> None:
    declared = "        with causes.because(causes.LINE):\n    " + PLANTED.replace("\n    ", "\n        ")
    found = _planted(PARTS, ADD_OUTCOME, declared)
    assert [u for u in found if "add_outcome" in u.where] == []


def test_a_call_handed_to_a_thread_is_a_call() -> None:
    handed = "        if outcome.line < 0:\n            asyncio.to_thread(self._store.table.update_item, Key={})\n"
    found = _planted(PARTS, ADD_OUTCOME, handed)
    assert any("add_outcome (update_item)" in u.where for u in found)


def test_a_signed_bedrock_request_outside_its_cause_fails_the_check() -> None:
    declared = "with causes.because(causes.SIGNED):\n                        headers = sign("
    source = _source(ENGINE)
    assert source.count(declared) == 1
    bare = source.replace(declared, "if True:\n                        headers = sign(")
    found = undeclared.undeclared(undeclared.modules(replaced={ENGINE: bare}))
    assert {u.where.split(" ", 1)[1] for u in found} == {"send (sign)"}


def test_a_declaration_names_the_causes_a_function_runs_under_and_changes_nothing() -> None:
    def read() -> str:
        return "read"

    marked = causes.under(causes.RUN, causes.POLL)(read)
    assert marked is read and marked() == "read"
    assert marked.__sluice_causes__ == (causes.RUN, causes.POLL)  # type: ignore[attr-defined]


def test_the_check_reads_every_module_of_the_core_and_the_handlers() -> None:
    names = {m.name for m in undeclared.modules()}
    on_disk = {str(p.relative_to(undeclared.ROOT)) for root in undeclared.CORE for p in Path(root).rglob("*.py")}
    assert names == on_disk and PARTS in names and "functions/sluice_handlers/webhook.py" in names
