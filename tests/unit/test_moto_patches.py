"""The local cloud patches moto's internals: on a moto it was not written for it must say so."""

from __future__ import annotations

import moto
import pytest

from sluice_local import moto_patches


def test_the_installed_moto_is_the_one_the_patches_were_written_for() -> None:
    assert moto.__version__ == moto_patches.WRITTEN_FOR, (
        f"moto {moto.__version__} is installed; sluice_local/moto_patches.py was written for moto "
        f"{moto_patches.WRITTEN_FOR}: check every patch against the new moto before changing WRITTEN_FOR"
    )


def test_another_moto_is_refused_with_what_to_do() -> None:
    with pytest.raises(moto_patches.UnsupportedMoto) as refused:
        moto_patches.check_version("5.3.0")
    message = str(refused.value)
    assert "moto 5.2.5" in message and "moto 5.3.0 is installed" in message
    assert "pip install -r requirements.txt" in message


def test_a_local_cloud_on_another_moto_does_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_local.cloud import LocalCloud

    monkeypatch.setattr(moto, "__version__", "6.0.0")
    cloud = LocalCloud(provider_base_url="http://127.0.0.1:9", api_key="sk-test")
    with pytest.raises(moto_patches.UnsupportedMoto, match=r"moto 6\.0\.0 is installed"), cloud.running():
        pass
