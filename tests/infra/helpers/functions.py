"""What test_functions.py and the tests beside it share."""

from __future__ import annotations

from sluice.contract.definition import FUNCTION_PLACEHOLDERS

from tests.infra.conftest import Synthesis
from tests.infra.helpers.workflow import STACK_INSTANCE, _flat


def our_functions(synthesis: Synthesis, env: str) -> dict[str, dict]:
    """Our Lambdas by handler module (CDK's own custom-resource Lambdas left out)."""
    functions = synthesis.resources(env, "AWS::Lambda::Function").values()
    ours = {}
    for function in functions:
        handler = function["Properties"].get("Handler", "")
        if handler.startswith("sluice_handlers."):
            ours[handler.split(".")[1]] = function
    return ours


def step_functions(synthesis: Synthesis, env: str) -> dict[str, dict]:
    """The state machine's step Lambdas by step name."""
    return {k: f for k, f in our_functions(synthesis, env).items() if k in FUNCTION_PLACEHOLDERS}


def webhook_function(synthesis: Synthesis, env: str) -> dict:
    return our_functions(synthesis, env)["webhook"]


def secret_id(synthesis: Synthesis, env: str, name: str) -> str:
    (logical_id,) = [
        k
        for k, s in synthesis.resources(env, "AWS::SecretsManager::Secret").items()
        if _flat(s["Properties"]["Name"]) == f"sluice/{env}/{STACK_INSTANCE}/{name}"
    ]
    return logical_id
