"""Builds the Lambda code asset with pip on the host, so synth needs no Docker."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import cast

import aws_cdk as cdk
import aws_cdk.aws_lambda as lambda_
import jsii

PACKAGES = ("sluice", "sluice_handlers")
# Every package the asset carries, pinned with its hashes (`make lock` writes it from
# requirements.txt, resolved for the runtime below).
LOCK_FILE = "requirements.lock"
EXCLUDE = ["__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", "tests"]


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
        # interpreter would write .pyc files that 3.12 ignores. The lock names every package and
        # its hashes: pip refuses any file whose hash it does not list, and resolves nothing else.
        platform_args = [arg for p in self.platforms for arg in ("--platform", p)]
        return [
            sys.executable, "-m", "pip", "install",
            "--requirement", str(self.source / LOCK_FILE),
            "--require-hashes",
            "--no-deps",
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


def lambda_code(source: Path, local: cdk.ILocalBundling | None = None) -> lambda_.Code:
    """The functions' one code asset, built on the host (`LocalBundling`) and named by what it holds.

    Hashed by its output, not its source: a rebuild that ships other code (a wheel republished, a
    lock changed by hand) gets another name, so CloudFormation updates every function, while an
    identical rebuild keeps the name and changes nothing.
    """
    return lambda_.Code.from_asset(
        str(source),
        exclude=EXCLUDE,
        asset_hash_type=cdk.AssetHashType.OUTPUT,
        bundling=cdk.BundlingOptions(
            image=cdk.DockerImage.from_registry("unused"),
            # jsii.implements makes it an ILocalBundling at runtime; mypy cannot tell.
            local=local or cast(cdk.ILocalBundling, LocalBundling(source=source)),
        ),
    )
