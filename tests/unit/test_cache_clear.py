"""`sluice cache clear` deletes answers that were paid for: it asks first, and off a terminal it
needs --yes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from sluice.cache.entries import DirStore, stats
from sluice.providers import OPENAI

from sluice_local.cli import main
from sluice_local.console import EXIT_USAGE
from tests.unit.cache_fakes import answer, fill, request


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _filled(tmp_path: Path) -> Path:
    fill(DirStore(tmp_path), "paid", [(request(n, {"q": n}), answer(n, f"a{n}")) for n in (1, 2)])
    return tmp_path


def _answers(where: Path) -> int:
    return stats(DirStore(where), OPENAI)["answers"]


def test_off_a_terminal_clear_needs_yes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    where = _filled(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert main(["cache", "clear", "--cache-dir", str(where)]) == EXIT_USAGE
    assert f"cache {where} holds 2 answers, each paid for once: add --yes to delete them" in capsys.readouterr().err
    assert _answers(where) == 2
    assert main(["cache", "clear", "--yes", "--cache-dir", str(where)]) == 0
    assert _answers(where) == 0


@pytest.mark.parametrize(("reply", "left"), [("\n", 2), ("n\n", 2), ("y\n", 0), ("yes\n", 0)])
def test_on_a_terminal_clear_asks_and_keeps_the_answers_unless_told_yes(
    reply: str, left: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    where = _filled(tmp_path)
    monkeypatch.setattr("sys.stdin", _Terminal(reply))
    assert main(["cache", "clear", "--cache-dir", str(where)]) == 0
    captured = capsys.readouterr()
    assert f"cache {where}: delete 2 answers, each paid for once? [y/N]" in captured.err
    assert _answers(where) == left
    assert ("kept" in captured.err) == bool(left)


def test_an_empty_cache_is_cleared_without_a_question(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    assert "removed 0 files" in capsys.readouterr().err
