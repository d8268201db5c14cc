"""The steps' settings, read once from the environment into one typed object (`sluice.contract`)."""

from __future__ import annotations

from .contract import BATCH_INCOMPLETE_POLICIES, MODES, Settings, SettingsError, parse_error_rate

__all__ = ["BATCH_INCOMPLETE_POLICIES", "MODES", "Settings", "SettingsError", "parse_error_rate"]
