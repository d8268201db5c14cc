"""A clean install: Sluice's wheel puts only Sluice's names at the top level of site-packages, and
in a fresh venv `pip install` of it alone runs the Python API against the simulator.

Both build the wheel in an isolated build and the second installs its dependencies, from PyPI:
`make test` runs them (`-m install`), a bare pytest does not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.install, pytest.mark.subprocess]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(ROOT)],
        check=True,
        timeout=600,
    )
    (found,) = out.glob("sluice-*.whl")
    return found


def test_the_wheel_adds_only_sluices_names_to_the_top_level(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}

    assert top == {"sluice", "sluice_handlers", "sluice_local"}
    # the CLI, the local cloud with the IAM statements its steps run under, and the state machine it runs
    for needed in (
        "sluice_local/cli/app.py",
        "sluice_local/cloud/local_cloud.py",
        "sluice_local/policies.json",
        "sluice_local/api/local_run.py",
        "sluice/contract/definition.py",
        "sluice_handlers/run_shard.py",
    ):
        assert needed in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for dependency in ("aiohttp", "boto3", "moto[", "orjson", "openai", "tqdm"):
        assert f"Requires-Dist: {dependency}" in metadata


def test_a_fresh_venv_with_the_wheel_alone_runs_the_api_example(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # from elsewhere, with no PYTHONPATH: the source tree (and the egg-info a build leaves in it) is not
    # there to satisfy the install, nor to answer the import
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",) and not k.startswith(("AWS_", "OPENAI_"))}
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)], cwd=tmp_path, env=env, check=True, timeout=900
    )
    done = subprocess.run(
        [str(python), str(ROOT / "examples" / "api.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "review-4: Simulated reply" in done.stdout and "SUCCEEDED" in done.stdout
    assert (tmp_path / "out" / "reviews.results.jsonl").read_bytes().count(b"\n") == 5
    sluice = subprocess.run([str(venv / "bin" / "sluice"), "--version"], capture_output=True, text=True, timeout=60)
    assert sluice.returncode == 0 and sluice.stdout.startswith("sluice 0.")
