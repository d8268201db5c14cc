"""A job id from a local `sluice run` given to a command for a deployed environment: no
environment knows it, so say what it is and where its outputs are."""

from __future__ import annotations

from pathlib import Path

import orjson
from sluice.contract import OUTPUT_SUFFIXES, REPORT_SUFFIX

from sluice_local.console import EXIT_NOT_FOUND, CliError

LOCAL_JOB_HINT = (
    "a job id printed by `sluice run` is a local job: a local run keeps nothing once it exits, "
    "and its outputs are in that run's --out directory (default: out/)"
)


def local_job_outputs(job_id: str, where: tuple[Path, ...] = (Path("out"), Path("."))) -> list[Path] | None:
    """The files a local `sluice run` of `job_id` wrote, if its summary is in ./out or here."""
    for folder in where:
        if not folder.is_dir():
            continue
        for summary in sorted(folder.glob("*" + OUTPUT_SUFFIXES["summary"]))[:500]:
            try:
                found = orjson.loads(summary.read_bytes()).get("job_id") == job_id
            except (OSError, orjson.JSONDecodeError, AttributeError):
                continue
            if found:
                stem = summary.name.removesuffix(OUTPUT_SUFFIXES["summary"])
                kinds = (*OUTPUT_SUFFIXES.values(), REPORT_SUFFIX)
                return [folder / (stem + k) for k in kinds if (folder / (stem + k)).exists()]
    return None


def refuse_local_job(job_id: str | None) -> None:
    """A local job id given to a deployed command: say what it is and where its outputs are."""
    if not job_id:
        return
    files = local_job_outputs(job_id)
    if files is not None:
        raise CliError(
            f"{job_id} is a local job (from `sluice run`): a local run keeps nothing once it exits, so no "
            f"environment knows it. Its outputs are here: {', '.join(str(f) for f in files)}",
            EXIT_NOT_FOUND,
        )
