"""Builds the Lambda code asset with pip on the host, so synth needs no Docker."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk
import jsii

PACKAGES = ("sluice", "handlers")


@jsii.implements(cdk.ILocalBundling)
class LocalBundling:
    def __init__(
        self,
        *,
        source: Path,
        python_version: str = "3.12",
        platforms: tuple[str, ...] = ("manylinux2014_x86_64", "manylinux_2_28_x86_64"),
    ) -> None:
        self.source = source
        self.python_version = python_version
        self.platforms = platforms

    def pip_command(self, output_dir: str) -> list[str]:
        # Wheels only, for the Lambda runtime's interpreter and CPU: never the host's. The
        # Python 3.12 runtime runs on Amazon Linux 2023 (glibc 2.34), so manylinux_2_28 wheels
        # are fine too and some packages publish nothing older. No bytecode: the host's
        # interpreter would write .pyc files that 3.12 ignores.
        platform_args = [arg for p in self.platforms for arg in ("--platform", p)]
        return [
            sys.executable, "-m", "pip", "install",
            "--requirement", str(self.source / "requirements.txt"),
            "--target", output_dir,
            *platform_args,
            "--only-binary=:all:",
            "--python-version", self.python_version,
            "--implementation", "cp",
            "--no-compile",
            "--disable-pip-version-check",
            "--quiet",
        ]  # fmt: skip

    def try_bundle(self, output_dir: str, options: cdk.BundlingOptions) -> bool:
        subprocess.run(self.pip_command(output_dir), check=True)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache")
        for package in PACKAGES:
            shutil.copytree(self.source / package, Path(output_dir) / package, ignore=ignore, dirs_exist_ok=True)
        return True
