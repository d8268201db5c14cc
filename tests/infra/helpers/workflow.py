"""What test_workflow.py and the tests beside it share."""

from __future__ import annotations

import json
from typing import Any

# How `_flat` spells the part of a name that is unique to the stack (`infra.config.stack_instance_id`).
STACK_INSTANCE = "<stack instance>"


def _flat(resource: Any) -> str:
    """A resource ARN as text, with intrinsic references spelled `<LogicalId>`."""
    if isinstance(resource, str):
        return resource
    if "Fn::Select" in resource and '"AWS::StackId"' in json.dumps(resource):
        return STACK_INSTANCE
    if "Fn::Join" in resource:
        return "".join(_flat(part) for part in resource["Fn::Join"][1])
    if "Fn::GetAtt" in resource:
        return "<{}.{}>".format(*resource["Fn::GetAtt"])
    if "Ref" in resource:
        return "<" + resource["Ref"] + ">"
    raise AssertionError(resource)
