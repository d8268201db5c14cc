"""What test_shared_limit_scale.py and the tests beside it share."""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from botocore.exceptions import ClientError


def _number_size(value: Decimal | int | float) -> int:
    """DynamoDB's size of a number: about one byte per two significant digits, plus one."""
    digits = str(abs(Decimal(value))).replace(".", "").lstrip("0") or "0"
    return (len(digits) + 1) // 2 + 1


def attribute_size(value: Any) -> int:
    """What a value counts toward DynamoDB's item size ("Item sizes and formats" in its guide)."""
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, bool) or value is None:
        return 1
    if isinstance(value, (int, float, Decimal)):
        return _number_size(value)
    if isinstance(value, dict):
        return 3 + sum(len(k.encode()) + attribute_size(v) + 1 for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 3 + sum(attribute_size(v) + 1 for v in value)
    raise TypeError(type(value))


def item_size(item: dict[str, Any]) -> int:
    return sum(len(name.encode()) + attribute_size(value) for name, value in item.items())


class RecordingTable:
    """The two calls the limiter makes on a DynamoDB Table resource, in memory: `get_item` and a
    conditional `update_item` of `SET a = :a, ...` and `REMOVE b`. Each call is recorded with the
    clock's time; `largest` is the largest item written."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[float, str]] = []
        self.largest = 0
        # a writer that wins the next this many conditional writes (it bumps the version first)
        self.lose_next = 0

    def get_item(self, Key: dict[str, str], ConsistentRead: bool = False) -> dict[str, Any]:
        self.calls.append((self.clock(), "read"))
        item = self.items.get((Key["pk"], Key["sk"]))
        return {"Item": dict(item)} if item is not None else {}

    def update_item(
        self,
        Key: dict[str, str],
        UpdateExpression: str,
        ConditionExpression: str,
        ExpressionAttributeValues: dict[str, Any],
        ExpressionAttributeNames: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        self.calls.append((self.clock(), "write"))
        key = (Key["pk"], Key["sk"])
        item = self.items.get(key)
        if self.lose_next and item is not None and "version" in item:
            self.lose_next -= 1
            item["version"] = int(item["version"]) + 1
        if not all(self._holds(item, c, ExpressionAttributeValues) for c in ConditionExpression.split(" AND ")):
            error = {"Error": {"Code": "ConditionalCheckFailedException", "Message": "The conditional request failed"}}
            raise ClientError(error, "UpdateItem")  # type: ignore[arg-type]
        new = dict(item or {}, pk=Key["pk"], sk=Key["sk"])
        assignments, _, removals = UpdateExpression.removeprefix("SET ").partition(" REMOVE ")
        for assignment in assignments.split(", "):
            name, value = assignment.split(" = ")
            new[(ExpressionAttributeNames or {}).get(name, name)] = ExpressionAttributeValues[value]
        for name in filter(None, (n.strip() for n in removals.split(","))):
            new.pop(name, None)
        self.items[key] = new
        self.largest = max(self.largest, item_size(new))
        return {}

    @staticmethod
    def _holds(item: dict[str, Any] | None, condition: str, values: dict[str, Any]) -> bool:
        missing = re.fullmatch(r"attribute_not_exists\((\w+)\)", condition)
        if missing:
            return item is None or missing.group(1) not in item
        equal = re.fullmatch(r"(\w+) = (:\w+)", condition)
        assert equal, condition
        return item is not None and item.get(equal.group(1)) == values[equal.group(2)]

    def per_second(self, kind: str, start: float, end: float) -> float:
        return sum(1 for at, what in self.calls if what == kind and start <= at < end) / (end - start)
