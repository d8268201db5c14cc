"""README a quick start, docs/ the reference: links that resolve, words the glossary defines, no stale figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PROSE = [README, *DOCS]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


def _without_code(text: str) -> str:
    return FENCE.sub("", text)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in _without_code(path.read_text()).splitlines():
        heading = re.match(r"^#{1,6} (.+)$", line)
        if heading:
            slug = _slug(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_the_readme_is_a_quick_start_that_starts_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    first_block = re.search(r"```sh\n(.*?)```", text, flags=re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands[:2] == ["make demo", "make test"]
    # nothing but the title comes before them
    assert text[: first_block.start()].strip() == "# Sluice"


@pytest.mark.parametrize("path", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_its_heading(path: Path) -> None:
    broken = []
    for target in LINK.findall(_without_code(path.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert broken == []


def test_the_anchor_of_a_heading_is_githubs() -> None:
    assert _slug("3. Set the secrets") == "3-set-the-secrets"
    assert _slug("What `sluice run` shows and keeps") == "what-sluice-run-shows-and-keeps"
    assert _slug("Limits and budget") == "limits-and-budget"


def test_every_word_the_glossary_defines_is_used_in_the_docs() -> None:
    glossary = ROOT / "docs" / "glossary.md"
    terms = re.findall(r"^### (.+)$", glossary.read_text(), flags=re.M)
    assert len(terms) >= 20
    elsewhere = " ".join(path.read_text() for path in PROSE if path != glossary)
    unused = [term for term in terms if not re.search(rf"\b{re.escape(term)}", elsewhere, flags=re.I)]
    assert unused == []


def test_every_sluice_word_the_issue_named_is_in_the_glossary() -> None:
    terms = {term.lower() for term in re.findall(r"^### (.+)$", (ROOT / "docs" / "glossary.md").read_text(), re.M)}
    named = {"settle", "sweep", "cutover", "lease", "opening wave", "turned down", "hand back", "slot", "part"}
    named |= {"shard", "requeued", "reconcile", "flex", "refused"}
    assert named <= terms


@pytest.mark.parametrize("path", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_test_count_or_suite_timing_in_prose(path: Path) -> None:
    """Such figures go stale: they live in bench/README.md, stamped with the commit they were measured at."""
    text = path.read_text()
    assert re.findall(r"\b\d[\d,]* (?:tests|test cases)\b", text) == []
    assert re.findall(r"\b\d[\d,]* (?:passed|failed)\b", text) == []
