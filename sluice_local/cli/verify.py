"""`sluice verify`: a job's outputs account for every input line exactly once, in order."""

from __future__ import annotations

import argparse
from pathlib import Path

from sluice.merge.verify import verify as check

from sluice_local.checks import summary_file, verify_order
from sluice_local.console import EXIT_JOB_FAILED, EXIT_OK, need_file


def run(args: argparse.Namespace) -> int:
    paths = [need_file(Path(p)) for p in (args.input, args.results, args.errors)]
    verify_order(*paths)
    summary = summary_file(need_file(Path(args.summary))) if args.summary else None
    with paths[0].open("rb") as inputs, paths[1].open("rb") as results, paths[2].open("rb") as errors:
        report = check(inputs, results, errors, summary)
    print(report.describe())
    return EXIT_OK if report.ok else EXIT_JOB_FAILED
