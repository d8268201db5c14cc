"""What a failed step says to a user: Step Functions hands a Lambda's failure over as an error name
and a JSON cause holding its type, message and stack trace; users get the type and message only."""

from __future__ import annotations

import orjson

# errors whose message says what the user asked for and why it cannot be: shown without their type
USER_ERRORS = frozenset({"PlanError"})


def failure_reason(error: str, cause: str) -> str:
    """`Type: message` of a step's failure, never its stack trace; a cause that is not a Lambda's
    JSON is shown as it came."""
    try:
        parsed = orjson.loads(cause)
    except orjson.JSONDecodeError:
        return f"{error}: {cause}" if cause else error
    if isinstance(parsed, dict) and parsed.get("errorMessage"):
        kind = parsed.get("errorType", error)
        # a refused option or input: the message is the user's, the class name means nothing to them
        return str(parsed["errorMessage"]) if kind in USER_ERRORS else f"{kind}: {parsed['errorMessage']}"
    return error


def is_user_error(error: str, cause: str) -> bool:
    """Whether a step failed on what its user asked for (`USER_ERRORS`), by the error's name or by
    the type its Lambda's cause names."""
    if error in USER_ERRORS:
        return True
    try:
        parsed = orjson.loads(cause)
    except orjson.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and parsed.get("errorType") in USER_ERRORS
