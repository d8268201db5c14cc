"""What `sluice run` writes and says once the job has ended: the local summary, the lines on the
terminal, and the exit code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sluice_local.console import EXIT_PROVIDER, human_seconds, human_usd, job_exit_code, write_output


@dataclass(frozen=True)
class RunFacts:
    """What this `sluice run` knows that the job's own summary does not: how it was asked for."""

    input_path: Path
    # the provider as a person names it: its base URL, or the built-in simulator; never its key
    provider: str
    settings: dict[str, Any] = field(default_factory=dict)
    # the whole command, the local cloud's start and the outputs' writing included
    command_seconds: float | None = None
    cache: bool = True


def local_summary(written: dict[str, Path], facts: RunFacts) -> dict[str, Any]:
    """The job's summary with the files this run wrote in place of the local bucket's keys,
    which are gone once `sluice run` exits, and the run's settings (`run`)."""
    summary: dict[str, Any] = orjson.loads(written["summary"].read_bytes())
    summary["input"] = str(facts.input_path)
    if isinstance(summary.get("outputs"), dict):
        summary["outputs"] = {kind: str(written[kind]) for kind in summary["outputs"] if kind in written}
    summary["run"] = {"provider": facts.provider, **facts.settings}
    if facts.command_seconds is not None:
        summary["command_seconds"] = round(facts.command_seconds, 3)
    write_output(written["summary"], orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return summary


def timing(summary: dict[str, Any], command_s: float) -> str:
    """`in 1.4 s (4.3 s with the local cloud)`: the job's wall time, Plan to Merge, as the summary
    and the report give it, and the whole command's."""
    wall = summary.get("wall_seconds")
    if wall is None:
        return f"after {human_seconds(command_s)}"
    return f"in {human_seconds(float(wall))} ({human_seconds(command_s)} with the local cloud)"


def swept(summary: dict[str, Any]) -> str:
    """`, 5 lines swept (3 recovered)`: lines the last sweep sent again, when there were any."""
    sweep = summary.get("sweep") or {}
    count = int(sweep.get("swept") or 0)
    if not count:
        return ""
    return f", {count:,} line{'s' if count != 1 else ''} swept ({int(sweep.get('recovered') or 0):,} recovered)"


def longest(summary: dict[str, Any]) -> str:
    """`, the longest line 9 attempts`: what the line retried most took, when one was retried."""
    most = int(summary.get("max_line_attempts") or 0)
    return f", the longest line {most:,} attempts" if most > 1 else ""


# codes whose lines `refusal_lines` and `budget_lines` explain
_EXPLAINED = frozenset({"provider_refused", "budget_exceeded"})


def error_lines(summary: dict[str, Any]) -> list[str]:
    """`1 retries_exhausted: gave up after 22 attempts (...), ...`: why lines ended in errors, one
    message a code, the most frequent first."""
    examples = summary.get("error_examples") or {}
    counts = sorted((summary.get("errors_by_code") or {}).items(), key=lambda item: -int(item[1]))
    return [f"{int(n):,} {code}: {examples.get(code, '—')}" for code, n in counts if code not in _EXPLAINED]


def validation_lines(summary: dict[str, Any]) -> list[str]:
    """`validated: 280 valid first time, 20 repaired, 0 invalid; answers turned down: schema 31,
    json 12`: a validating job's lines by how they ended, and what each check refused."""
    counts = summary.get("validation")
    if not isinstance(counts, dict):
        return []
    invalid = int(counts.get("invalid", 0))
    line = (
        f"validated: {int(counts.get('valid_first_time', 0)):,} valid first time, "
        f"{int(counts.get('repaired', 0)):,} repaired, {invalid:,} invalid"
        + (" (errors `invalid_output`)" if invalid else "")
    )
    refused = [(k.removeprefix("failed_"), int(n)) for k, n in counts.items() if k.startswith("failed_")]
    if refused:
        line += "; answers turned down: " + ", ".join(f"{check} {n:,}" for check, n in refused)
    return [line]


def usage(summary: dict[str, Any]) -> str:
    """`, 43,210 tokens (41,000 in, 2,210 out), $0.0077 at list prices (est.)`: what the job used."""
    tokens = summary.get("tokens") or {}
    if not tokens:
        return ""
    tokens_in, tokens_out = int(tokens.get("input", 0)), int(tokens.get("output", 0))
    text = f", {tokens_in + tokens_out:,} tokens ({tokens_in:,} in, {tokens_out:,} out)"
    cost = (summary.get("cost_estimate_usd") or {}).get("provider")
    text += f", {human_usd(cost)} at list prices (est.)" if cost is not None else ""
    cache = summary.get("cache") or {}
    if cache.get("hits"):
        saved = cache.get("saved_usd")
        text += f"; {int(cache['hits']):,} answered from the cache, {int(cache.get('misses', 0)):,} sent"
        text += f", {human_usd(saved)} saved (est.)" if saved else ""
    return text


def budget_lines(summary: dict[str, Any], *, cache: bool) -> list[str]:
    """The cap, what was spent, and how to send the rest from here: a local job has no `sluice
    retry`, but the response cache answers what was answered, so running the file again with a
    higher cap sends only what the cap kept back."""
    budget = summary.get("budget")
    if not budget:
        return []
    unsent = int(budget.get("unsent_lines") or 0)
    line = f"budget {human_usd(budget['cap_usd'])}: spent {human_usd(budget['spent_usd'])} (est.)"
    if not unsent:
        return [line]
    line += f"; {unsent:,} lines not sent (errors `budget_exceeded`)"
    if cache:
        advice = (
            "to send them, run the same file again with a higher --budget: the response cache answers the "
            "lines already answered, so only these are sent and paid"
        )
    else:
        advice = (
            "to send them, run the file again with a higher --budget and without --no-cache: the lines already "
            "answered were not kept, so they would be sent and paid again"
        )
    return [line, advice]


def deadline_lines(summary: dict[str, Any]) -> list[str]:
    """A deadline job's plan as it ran: whether it held, the shards by choice, the cost against
    all direct and all batch."""
    deadline = summary.get("deadline")
    if not deadline:
        return []
    held = "met" if deadline["met"] else "MISSED"
    chosen = ", ".join(f"{n:,} {choice}" for choice, n in deadline["shards_by_choice"].items())
    fallback = deadline.get("flex_fallback_lines") or 0
    return [
        f"deadline {deadline['deadline']}: {held} (ended {deadline['ended_at']}); shards: {chosen}; provider "
        f"{human_usd(deadline['as_run_usd'])} against {human_usd(deadline['all_direct_usd'])} all direct and "
        f"{human_usd(deadline['all_batch_usd'])} all batch (est.)"
        + (f"; {fallback:,} flex lines went on at the standard tier, at list price" if fallback else "")
    ]


def batch_direct_lines(summary: dict[str, Any]) -> list[str]:
    """How many lines of batch shards went direct, at list price, and why: no batch took them."""
    shards = [s for s in summary.get("shards") or [] if isinstance(s.get("batch"), dict)]
    direct = sum(int(s["batch"].get("direct_fallback_lines") or 0) for s in shards)
    if not direct:
        return []
    lines = sum(int(s.get("lines") or 0) for s in shards)
    return [
        f"{direct:,} of the {lines:,} lines of batch shards went direct, at list price: no batch took them "
        "(a part under the provider's fewest records a batch, a model its batch jobs do not run, or rows "
        "a batch left unanswered)"
    ]


def refusal_lines(summary: dict[str, Any]) -> list[str]:
    """The provider's own words when the job's first answers were all the same refusal, and what
    most likely caused it (a wrong URL, model or key)."""
    refused = summary.get("provider_refused")
    if not isinstance(refused, dict):
        return []
    status = refused.get("status")
    message = str(refused.get("message") or "").strip() or "(no message)"
    lines = [f"the provider refused the job's first requests alike: HTTP {status}: {message}"]
    cause = str(refused.get("cause") or "").strip()
    unsent = refused.get("lines")
    stopped = "the job stopped sending" + (
        f": {int(unsent):,} lines not sent or given up in flight (in the errors)" if unsent else ""
    )
    lines.append(f"likely cause: {cause}; {stopped}" if cause else stopped)
    return lines


def exit_code(summary: dict[str, Any], status: str, interrupted: int | None) -> int:
    """128 + the signal for a run a signal stopped; 8 when the provider refused the job's
    requests; else what the job's status says."""
    if interrupted is not None:
        return 128 + interrupted
    if isinstance(summary.get("provider_refused"), dict):
        return EXIT_PROVIDER
    return job_exit_code(status)
