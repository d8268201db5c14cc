"""Builds the Lambda asset for real, as `cdk synth` would, without synthesizing a stack."""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
import pytest

from infra.bundling import LocalBundling
from infra.functions import FUNCTIONS_DIR


@pytest.mark.bundling
def test_asset_has_linux_wheels_for_the_runtime_and_our_packages(tmp_path: Path) -> None:
    bundling = LocalBundling(source=FUNCTIONS_DIR)
    options = cdk.BundlingOptions(image=cdk.DockerImage.from_registry("unused"))
    assert bundling.try_bundle(str(tmp_path), options) is True

    parsers = list((tmp_path / "aiohttp").glob("_http_parser*.so"))
    assert [p.name for p in parsers] == ["_http_parser.cpython-312-x86_64-linux-gnu.so"]
    assert not list(tmp_path.rglob("*-darwin.so")) and not list(tmp_path.rglob("*.pyd"))
    for package in ("sluice", "handlers"):
        assert (tmp_path / package / "__init__.py").exists() or list((tmp_path / package).glob("*.py")), package
    assert (tmp_path / "sluice" / "contract.py").exists()
    # the handlers' structured logs and metrics
    assert (tmp_path / "aws_lambda_powertools" / "metrics").is_dir()
    assert not list(tmp_path.rglob("__pycache__"))
