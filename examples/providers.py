"""One file, any provider: `sluice run` of the same file on each provider family, in
each mode, printed as one table.

    .venv/bin/python examples/providers.py                  # the built-in simulator, every family
    .venv/bin/python examples/providers.py --file out/big.jsonl --only anthropic

Each run is `sluice run FILE --provider P --model MODEL --mode M --no-cache`, as a user types
it, so the table shows what a user sees: a family this checkout does not know, or a mode the
family has no API for, is its exit code (2) and the reason `sluice` gave. Exits 0 when every run
SUCCEEDED with no error, background included where the family has it, and background was refused
with 2 where it has not, else 1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# each family with a model it serves, and every mode: background must succeed where the family has
# background responses (the table in docs/providers.md: OpenAI's only), and be refused (exit 2) where it has none
PLAN: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("openai", "gpt-4o-mini", ("direct", "batch", "auto", "background")),
    ("anthropic", "claude-3-5-haiku-latest", ("direct", "batch", "auto", "background")),
    ("bedrock", "anthropic.claude-3-haiku-20240307-v1:0", ("direct", "batch", "auto", "background")),
    ("gemini", "gemini-2.5-flash", ("direct", "batch", "auto", "background")),
)
BACKGROUND = {"openai"}


@dataclass
class Row:
    provider: str
    model: str
    mode: str
    code: int
    status: str
    results: int | None
    errors: int | None
    seconds: float
    why: str


def run_one(file: Path, provider: str, model: str, mode: str, out: Path, extra: list[str]) -> Row:
    command = [sys.executable, "-m", "sluice_local.cli", "run", str(file), "--provider", provider, "--model", model]
    command += ["--mode", mode, "--no-cache", "--quiet", "--out", str(out), *extra]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    summary_path = out / f"{file.stem}.summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    counts = summary.get("counts", {})
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    why = ""
    if done.returncode and lines:
        # a refusal's first line says what; one ending in ":" lists the first cases after it
        why = lines[0] + (" " + lines[1].strip() if lines[0].endswith(":") and len(lines) > 1 else "")
    errors_path = out / f"{file.stem}.errors.jsonl"
    if summary and done.returncode and errors_path.exists():
        # a job that ran: what its failed lines say, not the last line of its output
        codes = Counter(json.loads(line)["error"]["code"] for line in errors_path.read_text().splitlines() if line)
        first = next((json.loads(line)["error"]["message"] for line in errors_path.read_text().splitlines()), "")
        why = ", ".join(f"{n:,} {code}" for code, n in codes.most_common()) + (f" (first: {first})" if first else "")
    return Row(
        provider,
        model,
        mode,
        done.returncode,
        str(summary.get("status") or "refused"),
        counts.get("results"),
        counts.get("errors"),
        seconds,
        why.removeprefix("sluice: "),
    )


def table(rows: list[Row]) -> str:
    head = ("provider", "model", "mode", "exit", "status", "results", "errors", "seconds")
    cells = [
        (r.provider, r.model, r.mode, str(r.code), r.status, _n(r.results), _n(r.errors), f"{r.seconds:.1f}")
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    right = {3, 5, 6, 7}

    def line(values: tuple[str, ...]) -> str:
        return "  ".join(
            v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True))
        )

    text = [line(head), line(tuple("-" * w for w in widths)), *(line(c) for c in cells)]
    notes = [f"{r.provider} {r.mode}: {r.why}" for r in rows if r.why]
    return "\n".join(text + (["", *notes] if notes else []))


def _n(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", type=Path, default=ROOT / "examples" / "reviews.jsonl")
    parser.add_argument("--only", action="append", metavar="PROVIDER", help="run this family only (repeatable)")
    parser.add_argument(
        "--allow-invalid", action="store_true", help="send the lines a family can take, the rest to errors"
    )
    args = parser.parse_args()
    extra = ["--allow-invalid"] if args.allow_invalid else []
    rows = []
    with tempfile.TemporaryDirectory(prefix="sluice-providers-") as tmp:
        for provider, model, modes in PLAN:
            if args.only and provider not in args.only:
                continue
            for mode in modes:
                out = Path(tmp) / f"{provider}-{mode}"
                rows.append(run_one(args.file.resolve(), provider, model, mode, out, extra))
                print(f"{provider} {mode}: exit {rows[-1].code}", file=sys.stderr, flush=True)
    print(table(rows))
    # the bar: every run SUCCEEDED with no error, and background refused (2) where the
    # family has none; anything else is this script's exit 1, so a check can rely on it
    met = all(
        r.code == 2 if r.mode == "background" and r.provider not in BACKGROUND else (r.code == 0 and r.errors == 0)
        for r in rows
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
