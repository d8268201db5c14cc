"""Batch turnarounds measured: how long earlier jobs' batches took, created to completed, kept per
provider family and model in one small object of the job bucket (`turnarounds_key`). A batch
cancelled or expired before it completed is kept too, flagged as censored (`AtLeast`, written
`{"at_least_s": ...}`): it says only that the batch took longer, and the slow batches are the ones
that end so, so leaving them out would drift the plan's figure short.

Merge adds a job's figures (`keep_turnarounds`: one GET and one PUT per model the job batched, and
nothing when none of its batches completed); a deadline job's Plan reads its model's (`read_turnarounds`,
one GET) for `sluice.plan.deadline.expected_turnaround`. `sluice run` keeps the same objects in its
cache directory between runs, and `sluice estimate --deadline` reads them there (`parse_turnarounds`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from sluice.contract import turnarounds_key
from sluice.core.aws_errors import read_json_if_any
from sluice.plan.deadline import AtLeast

# the figures an object keeps, the latest last: enough for a 90% point that moves with the provider
# (a busy week), few enough that the object stays a few kilobytes
KEPT = 100


def _figure(value: Any) -> float | None:
    if isinstance(value, dict) and "at_least_s" in value:
        found = _figure(value["at_least_s"])
        return None if found is None else AtLeast(found)
    if isinstance(value, AtLeast):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def _figures(values: Iterable[Any]) -> list[float]:
    return [f for f in map(_figure, values) if f is not None]


def _encoded(figure: float) -> Any:
    return {"at_least_s": float(figure)} if isinstance(figure, AtLeast) else figure


def parse_turnarounds(data: Any) -> list[float]:
    """The figures an object holds (its JSON, parsed), oldest first, censored ones as `AtLeast`;
    anything else in it is skipped, so that a damaged object plans on the default rather than
    failing a job."""
    found = data.get("turnarounds_s") if isinstance(data, dict) else None
    return _figures(found) if isinstance(found, list) else []


def kept(earlier: Sequence[float], measured: Sequence[float]) -> list[float]:
    """The earlier figures and this job's, the latest `KEPT`."""
    return [*earlier, *_figures(measured)][-KEPT:]


def encode_turnarounds(family: str, model: str, figures: Sequence[float], *, now: float) -> bytes:
    return orjson.dumps(
        {"family": family, "model": model, "updated_at": round(now, 3), "turnarounds_s": [_encoded(f) for f in figures]}
    )


def read_turnarounds(s3: Any, bucket: str, family: str, model: str | None) -> list[float]:
    """The figures measured of `family`'s `model`; none when nothing was (the object is missing)."""
    if not model:
        return []
    return parse_turnarounds(read_json_if_any(s3, bucket, turnarounds_key(family, model)))


def keep_turnarounds(
    s3: Any, bucket: str, family: str, measured: Mapping[str, Sequence[float]], *, now: float | None = None
) -> dict[str, list[float]]:
    """Add a job's figures, by model, to each model's object; returns what each now holds.

    A read and a plain write, not a conditional one: two jobs of one model merging at once may each
    write what it read plus its own figures, and the later write drops the other job's. A lost update
    now and then costs the plan one job's figures among up to a hundred, which its 90% point can
    afford; a conditional write would cost Merge a retry loop for a barely better estimate."""
    written: dict[str, list[float]] = {}
    for model, figures in measured.items():
        if not figures:
            continue
        key = turnarounds_key(family, model)
        figures_now = kept(parse_turnarounds(read_json_if_any(s3, bucket, key)), figures)
        s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=encode_turnarounds(family, model, figures_now, now=time.time() if now is None else now),
            ContentType="application/json",
        )
        written[model] = figures_now
    return written
