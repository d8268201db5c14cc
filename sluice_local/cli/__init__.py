"""`sluice`: run a job on this machine, or submit, follow, fetch, cancel and retry jobs of a
deployed environment; estimate what a file will cost; start the provider simulator.

One module per command (run, simulator, verify, estimate, submit, status, results, cancel,
retry), each with a `run(args)`; their arguments are declared in `parser`, and `app` is the
entry point the `sluice` script calls.
"""

from sluice_local.cli.app import main
from sluice_local.cli.parser import build_parser

__all__ = ["build_parser", "main"]
