"""`import sluice` is the Lambda core: the Python API behind `sluice.run` is imported on first use only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sluice

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.subprocess


def _modules_after(code: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", f"import sys\n{code}\nprint('\\n'.join(sys.modules))"],
        env={"PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(done.stdout.split())


@pytest.mark.slow
def test_importing_the_core_as_a_handler_does_imports_no_local_code() -> None:
    loaded = _modules_after("import sluice, sluice.plan.plan, sluice.merge.merge")
    assert "sluice.plan.plan" in loaded
    assert not {m for m in loaded if m.split(".")[0] in ("sluice_local", "moto")}


@pytest.mark.slow
def test_the_api_names_resolve_to_the_api_module_on_first_use() -> None:
    loaded = _modules_after("import sluice\nsluice.run")
    assert "sluice_local.api" in loaded
    assert sorted(sluice.API) == sorted(__import__(sluice.API_MODULE, fromlist=["__all__"]).__all__)
    assert sluice.SluiceError.__module__ == "sluice_local.api.errors"
    assert issubclass(sluice.InputError, sluice.SluiceError) and sluice.InputError.code == 3
    assert "run" in dir(sluice)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        sluice.nothing  # noqa: B018
