"""What test_output_check.py and the tests beside it share."""

from __future__ import annotations

from sluice.contract.model import Outcome

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "n?"}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}},
}


def answer(content: str) -> Outcome:
    message = {"role": "assistant", "content": content, "refusal": None}
    body = {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    return Outcome(1, "c-1", 200, body, "req-1")
