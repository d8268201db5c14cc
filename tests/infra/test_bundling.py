"""Builds the Lambda asset for real, as `cdk synth` would, without synthesizing a stack; and the
lock it is built from."""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

import aws_cdk as cdk
import aws_cdk.aws_lambda as lambda_
import jsii
import pytest
from aws_cdk import assertions

from infra.bundling import LOCK_FILE, LocalBundling, lambda_code
from infra.functions import FUNCTIONS_DIR

LOCK = FUNCTIONS_DIR / LOCK_FILE
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(text: str) -> dict[str, str]:
    return {_canonical(m[1]): m[2] for line in text.splitlines() if (m := _PIN.match(line))}


def _locked() -> dict[str, list[str]]:
    """Each package the lock pins (name==version) and the hashes it accepts for it."""
    locked: dict[str, list[str]] = {}
    current = ""
    for line in LOCK.read_text().splitlines():
        if match := _PIN.match(line):
            current = f"{_canonical(match[1])}=={match[2]}"
            locked[current] = []
        elif hashed := re.search(r"--hash=sha256:([0-9a-f]{64})", line):
            locked[current].append(hashed[1])
    return locked


def test_the_lock_pins_every_package_with_hashes_and_agrees_with_requirements() -> None:
    locked = _locked()
    assert locked and all(hashes for hashes in locked.values()), [p for p, h in locked.items() if not h]
    versions = dict(pin.split("==") for pin in locked)
    # every top-level pin is locked at its version: a changed requirements.txt needs `make lock`
    for name, version in _pins((FUNCTIONS_DIR / "requirements.txt").read_text()).items():
        assert versions.get(name) == version, f"{name}=={version} is not in {LOCK_FILE}; run `make lock`"
    # boto3 and botocore of one release, not whichever botocore is newest
    assert versions["botocore"] == versions["boto3"]


def test_pip_installs_the_lock_and_only_files_it_lists_the_hashes_of() -> None:
    command = LocalBundling(source=FUNCTIONS_DIR).pip_command("/out")
    assert command[command.index("--requirement") + 1] == str(LOCK)
    assert {"--require-hashes", "--no-deps", "--only-binary=:all:"} <= set(command)


@jsii.implements(cdk.ILocalBundling)
class _Writes:
    """A build that ships `content`, whatever the source says."""

    def __init__(self, content: str) -> None:
        self.content = content

    def try_bundle(self, output_dir: str, options: cdk.BundlingOptions) -> bool:
        (Path(output_dir) / "handler.py").write_text(self.content)
        return True


def _shipped_as(source: Path, content: str) -> str:
    stack = cdk.Stack(cdk.App())
    # jsii.implements makes it an ILocalBundling at runtime; mypy cannot tell
    code = lambda_code(source, cast(cdk.ILocalBundling, _Writes(content)))
    lambda_.Function(stack, "F", runtime=lambda_.Runtime.PYTHON_3_12, handler="handler.main", code=code)
    (function,) = assertions.Template.from_stack(stack).find_resources("AWS::Lambda::Function").values()
    return str(function["Properties"]["Code"]["S3Key"])


def test_the_asset_is_named_by_the_code_it_ships_not_by_its_source(tmp_path: Path) -> None:
    source = tmp_path / "functions"
    source.mkdir()
    (source / "requirements.txt").write_text("aiohttp==3.14.5\n")
    # the same source built twice: a wheel republished, or installed differently, ships other code
    assert _shipped_as(source, "print('one')") != _shipped_as(source, "print('two')")
    assert _shipped_as(source, "print('one')") == _shipped_as(source, "print('one')")


@pytest.mark.bundling
def test_asset_has_linux_wheels_for_the_runtime_and_our_packages(tmp_path: Path) -> None:
    bundling = LocalBundling(source=FUNCTIONS_DIR)
    options = cdk.BundlingOptions(image=cdk.DockerImage.from_registry("unused"))
    assert bundling.try_bundle(str(tmp_path), options) is True

    parsers = list((tmp_path / "aiohttp").glob("_http_parser*.so"))
    assert [p.name for p in parsers] == ["_http_parser.cpython-312-x86_64-linux-gnu.so"]
    assert not list(tmp_path.rglob("*-darwin.so")) and not list(tmp_path.rglob("*.pyd"))
    for package in ("sluice", "sluice_handlers"):
        assert (tmp_path / package / "__init__.py").exists() or list((tmp_path / package).glob("*.py")), package
    assert (tmp_path / "sluice" / "contract" / "__init__.py").exists()
    # the handlers' structured logs and metrics
    assert (tmp_path / "aws_lambda_powertools" / "metrics").is_dir()
    assert not list(tmp_path.rglob("__pycache__"))
    # exactly what the lock pins: nothing resolved on the side, boto3's own botocore
    installed = {
        f"{_canonical(m[1])}=={m[2]}"
        for info in tmp_path.glob("*.dist-info")
        if (m := re.fullmatch(r"(.+)-([^-]+)\.dist-info", info.name))
    }
    assert installed == set(_locked())
