"""What test_config.py and the tests beside it share."""

from __future__ import annotations

import copy

from tests.infra.conftest import CONTEXT

ENVIRONMENTS = CONTEXT["environments"]


def with_value(env: str, key: str, value: object) -> dict:
    environments = copy.deepcopy(ENVIRONMENTS)
    environments[env][key] = value
    return environments
