"""What a DynamoDB request consumes, as DynamoDB counts it: the items it touches and their units.

The rules are those of
https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/read-write-operations.html:
a write costs a unit per 1 KB of the larger of the item before and after it (a delete, of the
item it removed), a read a unit per 4 KB of the item and half that when eventually consistent, a
transaction twice either, a batch item by item, a Query one rounding of all the bytes it read
before its filter, and a conditional write whose condition fails is still charged for the item it
checked. A read of an item that is not there costs the minimum. A write to an item that a global
secondary index holds writes the index too (`DynamoRequest._index_writes`). Item sizes are
`sluice_local.quotas.item_size`, DynamoDB's own formula.

The items' sizes come from the table as stored, read before and after the request
(`MotoTables`, moto's store; the local cloud runs one DynamoDB request at a time).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from sluice_local.ledger import Call, Caller, error_code
from sluice_local.quotas import item_size

KB = 1024
READ_UNIT_BYTES = 4 * KB
WRITE_UNIT_BYTES = KB

Attributes = dict[str, Any]


def read_units(size: int, *, consistent: bool, transactional: bool = False) -> float:
    units = max(1, math.ceil(size / READ_UNIT_BYTES))
    if transactional:
        return 2.0 * units
    return float(units) if consistent else units / 2


def write_units(size: int, *, transactional: bool = False) -> float:
    units = max(1, math.ceil(size / WRITE_UNIT_BYTES))
    return 2.0 * units if transactional else float(units)


@dataclass(frozen=True)
class TableShape:
    """A table's key attributes and its global secondary indexes (name, hash key, projected attributes;
    None for ALL)."""

    hash_key: str
    range_key: str | None
    indexes: tuple[tuple[str, str, frozenset[str] | None], ...] = ()


class Tables(Protocol):
    """How the ledger reads the tables (moto's, through `sluice_local.moto_patches`)."""

    def shape(self, table: str) -> TableShape | None: ...

    def item(self, table: str, key: Attributes) -> Attributes | None: ...

    def partition_sizes(self, table: str, pk: Attributes, limit: int) -> list[int]: ...


def _text(value: Attributes | None) -> str:
    if not value:
        return ""
    (inner,) = value.values()
    return str(inner)


@dataclass
class _Target:
    table: str
    key: Attributes
    kind: str  # get | put | update | delete | check
    consistent: bool = False
    transactional: bool = False
    new_item: Attributes | None = None
    before: Attributes | None = None


class DynamoRequest:
    """One DynamoDB request: its items' sizes before it runs, then the records once it has."""

    def __init__(self, operation: str, body: dict[str, Any], tables: Tables) -> None:
        self.operation = operation
        self.body = body
        self.tables = tables
        self.targets = list(self._targets())
        for target in self.targets:
            if target.kind != "get":
                target.before = tables.item(target.table, target.key)

    def _key(self, table: str, item: Attributes) -> Attributes:
        shape = self.tables.shape(table)
        if shape is None:
            return {}
        names = [shape.hash_key] + ([shape.range_key] if shape.range_key else [])
        return {name: item[name] for name in names if name in item}

    def _targets(self) -> Iterator[_Target]:
        op, body = self.operation, self.body
        consistent = bool(body.get("ConsistentRead"))
        if op in ("GetItem", "UpdateItem", "DeleteItem"):
            kind = {"GetItem": "get", "UpdateItem": "update", "DeleteItem": "delete"}[op]
            yield _Target(body["TableName"], body["Key"], kind, consistent)
        elif op == "PutItem":
            table = body["TableName"]
            yield _Target(table, self._key(table, body["Item"]), "put", new_item=body["Item"])
        elif op == "BatchGetItem":
            for table, request in body.get("RequestItems", {}).items():
                for key in request.get("Keys", []):
                    yield _Target(table, key, "get", bool(request.get("ConsistentRead")))
        elif op == "BatchWriteItem":
            for table, requests in body.get("RequestItems", {}).items():
                for request in requests:
                    if "PutRequest" in request:
                        item = request["PutRequest"]["Item"]
                        yield _Target(table, self._key(table, item), "put", new_item=item)
                    else:
                        yield _Target(table, request["DeleteRequest"]["Key"], "delete")
        elif op in ("TransactWriteItems", "TransactGetItems"):
            kinds = {"Get": "get", "Put": "put", "Update": "update", "Delete": "delete", "ConditionCheck": "check"}
            for action in body.get("TransactItems", []):
                ((name, detail),) = action.items()
                table = detail["TableName"]
                key = detail.get("Key") or self._key(table, detail.get("Item", {}))
                yield _Target(table, key, kinds[name], True, True, new_item=detail.get("Item"))

    def records(self, caller: Caller, at: float, seconds: tuple[float, float], response: Any) -> list[Call]:
        """What the request consumed, item by item, once `response` (botocore's) has come; `seconds`:
        the request's wall and CPU seconds, on its first record."""
        error = error_code(response)
        answer: dict[str, Any] = {}
        if self.operation in ("Query", "Scan") and not error:
            answer = orjson.loads(response.content or b"{}")
        base: dict[str, Any] = {
            "at": at,
            "service": "dynamodb",
            "operation": self.operation,
            "step": caller.step,
            "shard": caller.shard,
            "execution": caller.execution,
            "seconds": seconds[0],
            "cpu": seconds[1],
            "error": error,
        }
        if self.operation in ("Query", "Scan"):
            return self._query(base, answer, error)
        failed_condition = error in ("ConditionalCheckFailedException", "TransactionCanceledException")
        if error and not failed_condition:
            # refused before it touched an item (validation, a quota): DynamoDB charges nothing
            refused = [Call(**base, table=t.table, pk=self._pk(t), sk=self._sk(t)) for t in self.targets]
            return refused[:1] + [replace(c, seconds=0.0, cpu=0.0, more=True) for c in refused[1:]]
        out: list[Call] = []
        for target in self.targets:
            after = None if failed_condition else self.tables.item(target.table, target.key)
            if target.kind == "get":
                size = item_size(after) if after else 0
                units = read_units(size, consistent=target.consistent, transactional=target.transactional)
                out.append(
                    Call(
                        **base,
                        table=target.table,
                        pk=self._pk(target),
                        sk=self._sk(target),
                        read_units=units,
                        item_bytes=size,
                    )
                )
                continue
            before_size = item_size(target.before) if target.before else 0
            after_size = item_size(after) if after else 0
            # a failed condition, or a condition check, is charged for the item it read
            charged = before_size if failed_condition or target.kind == "check" else max(before_size, after_size)
            units = write_units(charged, transactional=target.transactional)
            out.append(
                Call(
                    **base,
                    table=target.table,
                    pk=self._pk(target),
                    sk=self._sk(target),
                    write_units=units,
                    item_bytes=after_size if after is not None else before_size,
                )
            )
            if not failed_condition and target.kind != "check":
                out.extend(self._index_writes(base, target, after))
        # the request's seconds once, on its first item
        return out[:1] + [replace(c, seconds=0.0, cpu=0.0, more=True) for c in out[1:]]

    def _pk(self, target: _Target) -> str:
        shape = self.tables.shape(target.table)
        return _text(target.key.get(shape.hash_key)) if shape else ""

    def _sk(self, target: _Target) -> str:
        shape = self.tables.shape(target.table)
        return _text(target.key.get(shape.range_key)) if shape and shape.range_key else ""

    def _index_writes(self, base: dict[str, Any], target: _Target, after: Attributes | None) -> list[Call]:
        """A write to an item a global secondary index holds writes the index too: once when the
        item's index key stays, a removal and a put when it changes; nothing when nothing changed."""
        shape = self.tables.shape(target.table)
        if shape is None or after == target.before:
            return []
        out: list[Call] = []
        for name, hash_key, projected in shape.indexes:
            old = (target.before or {}).get(hash_key)
            new = (after or {}).get(hash_key)
            written = [(new, after)] if old == new else [(old, target.before), (new, after)]
            for value, item in written:
                if value is None or item is None:
                    continue
                kept = item if projected is None else {k: v for k, v in item.items() if k in projected}
                size = item_size(kept)
                out.append(
                    Call(
                        **base,
                        table=target.table,
                        index=name,
                        pk=_text(value),
                        write_units=write_units(size),
                        item_bytes=size,
                    )
                )
        return out

    def _query(self, base: dict[str, Any], response: dict[str, Any], error: str) -> list[Call]:
        body = self.body
        table = body.get("TableName", "")
        index = body.get("IndexName", "")
        shape = self.tables.shape(table)
        items = response.get("Items", [])
        count = int(response.get("Count", len(items)))
        scanned = int(response.get("ScannedCount", count))
        pk_attr = shape.hash_key if shape else ""
        if index and shape:
            pk_attr = next((h for n, h, _ in shape.indexes if n == index), pk_attr)
        pk = _text(items[0].get(pk_attr)) if items and pk_attr in items[0] else _query_value(body, pk_attr)
        sizes = []
        for returned in items:
            full = None
            if shape and not index and shape.hash_key in returned:
                full = self.tables.item(table, self._key(table, returned))
            sizes.append(item_size(full or returned))
        read = sum(sizes)
        if scanned > count:
            # DynamoDB charges for what it read before the filter: the filtered-out items at the
            # partition's mean size
            others = self.tables.partition_sizes(table, {pk_attr: {"S": pk}}, 200) if pk else []
            mean = sum(others) / len(others) if others else (read / len(sizes) if sizes else KB)
            read += int((scanned - count) * mean)
        consistent = bool(body.get("ConsistentRead")) and not index
        units = 0.0 if error else read_units(read, consistent=consistent)
        return [Call(**base, table=table, index=index, pk=pk, read_units=units, item_bytes=read)]


def _query_value(body: dict[str, Any], attribute: str) -> str:
    """The partition key a Query names in its key condition (`#n = :v` or `name = :v`)."""
    names = body.get("ExpressionAttributeNames", {})
    values = body.get("ExpressionAttributeValues", {})
    for name, value in re.findall(r"([#\w]+)\s*=\s*(:\w+)", body.get("KeyConditionExpression", "")):
        if names.get(name, name) == attribute and value in values:
            return _text(values[value])
    return ""


class MotoTables:
    """moto's DynamoDB tables as the ledger reads them: shapes, and items by key, as stored."""

    def __init__(self, account: str, region: str) -> None:
        self._account = account
        self._region = region
        self._shapes: dict[str, TableShape | None] = {}

    def _table(self, name: str) -> Any:
        from moto.dynamodb.models import dynamodb_backends

        return dynamodb_backends[self._account][self._region].tables.get(name)

    def shape(self, table: str) -> TableShape | None:
        if table not in self._shapes:
            found = self._table(table)
            if found is None:
                return None
            indexes = []
            for index in found.global_indexes:
                (hash_key,) = [k["AttributeName"] for k in index.schema if k["KeyType"] == "HASH"]
                projection = index.projection or {}
                kind = projection.get("ProjectionType", "ALL")
                kept = None
                if kind != "ALL":
                    kept = frozenset(found.table_key_attrs) | set(index.schema_key_attrs)
                    kept |= set(projection.get("NonKeyAttributes", []) if kind == "INCLUDE" else [])
                indexes.append((index.name, hash_key, kept))
            self._shapes[table] = TableShape(found.hash_key_attr, found.range_key_attr, tuple(indexes))
        return self._shapes[table]

    def item(self, table: str, key: Attributes) -> Attributes | None:
        from moto.dynamodb.models.dynamo_type import DynamoType

        found, shape = self._table(table), self.shape(table)
        if found is None or shape is None or shape.hash_key not in key:
            return None
        # .get, never [], on moto's defaultdict: a lookup must not create a partition
        stored = found.items.get(DynamoType(key[shape.hash_key]))
        if stored is not None and shape.range_key is not None:
            if shape.range_key not in key:
                return None
            stored = stored.get(DynamoType(key[shape.range_key]))
        return dict(stored.to_json()["Attributes"]) if stored is not None else None

    def partition_sizes(self, table: str, pk: Attributes, limit: int) -> list[int]:
        from moto.dynamodb.models.dynamo_type import DynamoType

        found, shape = self._table(table), self.shape(table)
        if found is None or shape is None or shape.range_key is None:
            return []
        stored = found.items.get(DynamoType(pk[shape.hash_key])) or {}
        return [item_size(item.to_json()["Attributes"]) for item in list(stored.values())[:limit]]
