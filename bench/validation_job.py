"""Output validation as a whole job: --lines lines with a json_schema each, the simulator
answering 10% off the schema, 5% invalid JSON and 5% cut short, run with `sluice-validate: all` in
direct, batch and background mode on the local cloud (moto, in-process Lambdas, IAM enforced).

Prints per mode: results and errors, the results that still fail the checks (checked here again,
against each line's own request: must be 0), the answers sent again (the simulator's log: every
send after a line's first, and in batch mode every direct send), the summary's counts by check,
whether every answer turned down was sent again, and `verify` (every line accounted for once).

    .venv/bin/python bench/validation_job.py --lines 2000
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

import orjson  # noqa: E402
from sluice.contract import VALIDATION_CHECKS  # noqa: E402
from sluice.formats.validation import Validator  # noqa: E402

from sluice_local.cloud import JobRun, LocalCloud, LocalSettings, run_job  # noqa: E402
from sluice_local.simulator import SimConfig, SimulatorServer  # noqa: E402

WORK = ROOT / ".work"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "product": {"type": "string"},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "sentiment": {"enum": ["positive", "neutral", "negative"]},
        "issues": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["product", "rating", "sentiment", "issues"],
    "additionalProperties": False,
}
FAULTS = {"rate_off_schema": 0.10, "rate_invalid_json": 0.05, "rate_truncated": 0.05}
# background mode runs Responses lines (the only ones with a background form); the others chat lines
MODES = {"direct": CHAT, "batch": CHAT, "background": RESPONSES}


def make_input(path: Path, lines: int, url: str) -> None:
    with path.open("wb") as out:
        for n in range(lines):
            review = f"Extract the review {n}: the kettle boils fast, but the lid is loose."
            if url == CHAT:
                body: dict[str, Any] = {
                    "model": "gpt-4o-mini",
                    "messages": [{"role": "user", "content": review}],
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "review", "strict": True, "schema": SCHEMA},
                    },
                }
            else:
                body = {
                    "model": "gpt-4o-mini",
                    "input": review,
                    "text": {"format": {"type": "json_schema", "name": "review", "strict": True, "schema": SCHEMA}},
                }
            out.write(orjson.dumps({"custom_id": f"v-{n}", "method": "POST", "url": url, "body": body}) + b"\n")


def report(mode: str, url: str, path: Path, run: JobRun, log: list[dict[str, Any]], seconds: float) -> bool:
    checks = Validator(frozenset(VALIDATION_CHECKS))
    bodies = {r["custom_id"]: r["body"] for r in map(orjson.loads, path.read_bytes().splitlines())}
    invalid = sum(1 for r in run.results if checks.validate(url, bodies[r["custom_id"]], r["response"]["body"]))
    sent = Counter(e["custom_id"] for e in log if e["method"] == "POST" and e["custom_id"])
    # a batch's rows are not requests of their own: every direct send of a batch job is one again
    resends = sum(sent.values()) if mode == "batch" else sum(sent.values()) - len(sent)
    validation = run.summary.get("validation", {})
    by_check = {k.removeprefix("failed_"): v for k, v in validation.items() if k.startswith("failed_")}
    turned_down = sum(by_check.values())
    ended = {k: validation.get(k, 0) for k in ("valid_first_time", "repaired", "invalid")}
    # an answer turned down is sent again unless it was its line's last send (the line is then invalid_output)
    expected = turned_down - ended["invalid"]
    verified = run.verify(path)
    codes = Counter(e["error"]["code"] for e in run.errors)
    print(f"{mode:10} {run.summary['status']} in {seconds:.1f} s")
    print(f"           results {len(run.results):,}, errors {len(run.errors):,}", dict(codes) if codes else "")
    print(f"           invalid lines in results: {invalid}")
    print(f"           answers turned down by check: {by_check}")
    print(
        f"           sent again: {resends:,} (answers turned down: {turned_down:,}, of which the last sends of "
        f"invalid lines: {ended['invalid']}; each other sent again: {resends == expected})"
    )
    print(f"           lines by how they ended: {ended} (sum {sum(ended.values()):,})")
    print(f"           verify: {verified.describe()}")
    accounted = sum(ended.values()) == len(run.results) + codes["invalid_output"]
    return invalid == 0 and verified.ok and resends == expected and accounted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--shard-lines", type=int, default=500)
    parser.add_argument(
        "--attempts", type=int, default=8, help="sends an answer gets in all (sluice-validate-attempts)"
    )
    parser.add_argument("--modes", default=",".join(MODES), help="direct, batch, background, separated by commas")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    settings = LocalSettings(
        cache="off", concurrency=200, map_concurrency=4, shard_lines=args.shard_lines, poll_seconds=1
    )
    print(f"{args.lines:,} lines with a json_schema each; simulator faults {FAULTS}; {args.attempts} sends at most")
    ok = True
    with SimulatorServer(SimConfig(latency_s=0.02, seed=33)) as sim:
        cloud = LocalCloud(provider_base_url=sim.base_url, api_key="sk-bench-validate", settings=settings)
        with cloud.running():
            sim.configure(
                **FAULTS, batch_phase_s=0.2, webhook_url=cloud.webhook_url, webhook_secret=cloud.webhook_secret
            )
            for mode in args.modes.split(","):
                url = MODES[mode]
                path = WORK / f"validate-{mode}-{args.lines}.jsonl"
                make_input(path, args.lines, url)
                sim.clear_log()
                metadata = {
                    "sluice-mode": mode,
                    "sluice-validate": "all",
                    "sluice-validate-attempts": str(args.attempts),
                }
                started = time.monotonic()
                run = run_job(cloud, path, key=f"inbox/validate-{mode}.jsonl", metadata=metadata)
                ok &= report(mode, url, path, run, list(sim.log), time.monotonic() - started)
                path.unlink()
    print("every mode: 0 invalid in results, every turned-down answer sent again, every line accounted for:", ok)


if __name__ == "__main__":
    main()
