"""Run the README's local commands as written, in order, and print each one's exit code and time.

The commands are read from the README's shell blocks, not copied here, so a command the README
changes is the command this runs. Those that need what this machine has not (a real provider's
key, an AWS account, `cdk deploy`) are listed as skipped, with why. The command that starts the
simulator alone is run in the background on its port, for the command that sends to it, and is
checked and stopped at its own place in the list.

    .venv/bin/python bench/readme_commands.py            # from the repo root, after `make demo`
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what a command needs that a machine without accounts has not: why it is skipped
NEEDS = {
    "api.openai.com": "a real OpenAI key",
    "api.anthropic.com": "a real Anthropic key",
    "--env dev": "a deployed stack (an AWS account)",
    "aws ": "an AWS account",
    "npx ": "an AWS account (cdk deploy)",
    "make synth": "the CDK CLI from npm (tests/infra synthesizes the same stacks)",
    "make test": "the whole suite, which CI runs (.ci/run) and whose time is said apart",
}
SIMULATOR = re.compile(r"sluice simulator --port (\d+)")


def commands(readme: str) -> list[str]:
    """Each shell command of the README's ```sh blocks, continuation lines joined, comments dropped."""
    found: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", readme, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                found.append(command)
    return found


def skipped(command: str) -> str | None:
    return next((why for needle, why in NEEDS.items() if needle in command), None)


def _healthy(port: int, within_s: float) -> bool:
    until = time.monotonic() + within_s
    while time.monotonic() < until:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/health", timeout=1):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a command may take")
    args = parser.parse_args()
    listed = commands((ROOT / "README.md").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "AWS_ENDPOINT"))}
    # the simulator the README starts alone, up before the command that sends to it
    simulators: dict[str, subprocess.Popen[bytes]] = {}
    for command in listed:
        match = SIMULATOR.search(command)
        if match and not skipped(command):
            simulators[command] = subprocess.Popen(
                ["bash", "-c", command], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            if not _healthy(int(match.group(1)), 30):
                print(f"the simulator did not start: {command}", file=sys.stderr)
    rows: list[tuple[str, str, str]] = []
    failed = 0
    try:
        for command in listed:
            why = skipped(command)
            if why:
                rows.append((command, "skipped", why))
                continue
            if command in simulators:
                match = SIMULATOR.search(command)
                assert match is not None
                up = simulators[command].poll() is None and _healthy(int(match.group(1)), 5)
                rows.append((command, "0" if up else "down", "running, answered /sim/health"))
                failed += not up
                continue
            started = time.monotonic()
            try:
                done = subprocess.run(
                    ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, timeout=args.timeout
                )
                code = done.returncode
            except subprocess.TimeoutExpired:
                code = -1
            spent = time.monotonic() - started
            rows.append((command, str(code), f"{spent:.1f} s"))
            failed += code != 0
            print(f"{code:>4}  {spent:7.1f} s  {command}", file=sys.stderr, flush=True)
    finally:
        for process in simulators.values():
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
    print("| command | exit | time or why skipped |\n|---|---|---|")
    for command, said, note in rows:
        print(f"| `{command}` | {said} | {note} |")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
