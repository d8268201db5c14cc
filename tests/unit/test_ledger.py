"""The ledger counts DynamoDB capacity units as DynamoDB does, and finds S3's bucket and key."""

from __future__ import annotations

from typing import Any

import pytest
from sluice.contract import causes

from sluice_local.dynamo_meter import DynamoRequest, Tables, TableShape
from sluice_local.ledger import Caller, CallLedger, calling, s3_target

KB = 1024


class Response:
    def __init__(self, status: int = 200, content: bytes = b"{}") -> None:
        self.status_code = status
        self.content = content


CONDITION_FAILED = Response(400, b'{"__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException"}')


def text(n: int) -> dict[str, str]:
    return {"S": "x" * n}


class FakeTables(Tables):
    """A table `t` keyed pk/sk, with an index on `gid` that projects `projected` (None: ALL)."""

    def __init__(self, projected: frozenset[str] | None = None) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self._shape = TableShape("pk", "sk", (("by_gid", "gid", projected),))

    def shape(self, table: str) -> TableShape | None:
        return self._shape

    def item(self, table: str, key: dict[str, Any]) -> dict[str, Any] | None:
        return self.items.get((key["pk"]["S"], key["sk"]["S"]))

    def partition_sizes(self, table: str, pk: dict[str, Any], limit: int) -> list[int]:
        return [3 * KB]

    def put(self, pk: str, sk: str, **attributes: Any) -> dict[str, Any]:
        item = {"pk": {"S": pk}, "sk": {"S": sk}, **attributes}
        self.items[(pk, sk)] = item
        return item


def key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def run(
    tables: FakeTables, operation: str, body: dict[str, Any], then: Any = None, answer: Response | None = None
) -> Any:
    """The request's records, with `then` applied to the table as the service would between before and after."""
    request = DynamoRequest(operation, {"TableName": "t", **body}, tables)
    if then is not None:
        then()
    return request.records(Caller("step", 3, "exec"), 0.0, (0.001, 0.001), answer or Response())


def test_a_write_costs_a_unit_per_kb_of_the_larger_of_the_item_before_and_after() -> None:
    tables = FakeTables()
    tables.put("P", "A", body=text(3 * KB))
    [shrunk] = run(tables, "UpdateItem", {"Key": key("P", "A")}, then=lambda: tables.put("P", "A", body=text(100)))
    assert shrunk.write_units == 4 and shrunk.item_bytes < KB
    [grown] = run(tables, "PutItem", {"Item": key("P", "B")}, then=lambda: tables.put("P", "B", body=text(1500)))
    assert grown.write_units == 2 and (grown.pk, grown.sk, grown.step, grown.shard) == ("P", "B", "step", 3)


def test_a_failed_conditional_write_is_still_charged_for_the_item_it_checked() -> None:
    tables = FakeTables()
    tables.put("P", "A", body=text(2500))
    [refused] = run(tables, "UpdateItem", {"Key": key("P", "A")}, answer=CONDITION_FAILED)
    assert refused.write_units == 3 and refused.error == "ConditionalCheckFailedException"


def test_a_read_costs_a_unit_per_4_kb_and_half_of_that_when_eventually_consistent() -> None:
    tables = FakeTables()
    tables.put("P", "A", body=text(5 * KB))
    [strong] = run(tables, "GetItem", {"Key": key("P", "A"), "ConsistentRead": True})
    [eventual] = run(tables, "GetItem", {"Key": key("P", "A")})
    [missing] = run(tables, "GetItem", {"Key": key("P", "none"), "ConsistentRead": True})
    assert (strong.read_units, eventual.read_units, missing.read_units) == (2, 1, 1)


def test_a_batch_is_counted_item_by_item_and_a_transaction_twice() -> None:
    tables = FakeTables()
    items = [{"pk": {"S": "P"}, "sk": {"S": f"I{n}"}, "body": text(1500)} for n in range(3)]

    def store() -> None:
        for item in items:
            tables.put("P", item["sk"]["S"], body=item["body"])

    batch = run(tables, "BatchWriteItem", {"RequestItems": {"t": [{"PutRequest": {"Item": i}} for i in items]}}, store)
    assert [r.write_units for r in batch] == [2, 2, 2] and [r.sk for r in batch] == ["I0", "I1", "I2"]
    transaction = run(tables, "TransactWriteItems", {"TransactItems": [{"Put": {"TableName": "t", "Item": items[0]}}]})
    assert [r.write_units for r in transaction] == [4]


def test_a_query_costs_the_bytes_it_read_before_its_filter_rounded_once() -> None:
    tables = FakeTables()
    rows = [tables.put("P", f"I{n}", body=text(1500)) for n in range(2)]
    answer = Response(200, b'{"Items": %s, "Count": 2, "ScannedCount": 4}' % str(rows).replace("'", '"').encode())
    [query] = run(tables, "Query", {"KeyConditionExpression": "pk = :p", "ConsistentRead": True}, answer=answer)
    # 2 items of ~1.5 KB returned and 2 filtered out at the partition's 3 KB: ~9 KB, 3 units
    assert query.pk == "P" and query.read_units == 3 and query.sk == ""


@pytest.mark.parametrize(("projected", "units"), [(None, 3), (frozenset({"pk", "sk", "gid"}), 1)])
def test_an_item_an_index_holds_writes_the_index_as_projected(projected: frozenset[str] | None, units: int) -> None:
    tables = FakeTables(projected)
    written = run(
        tables,
        "PutItem",
        {"Item": key("P", "A")},
        then=lambda: tables.put("P", "A", gid={"S": "resp_1"}, body=text(2500)),
    )
    [table, index] = written
    assert table.write_units == 3 and (index.index, index.pk, index.write_units) == ("by_gid", "resp_1", units)


def test_s3_requests_name_their_bucket_and_key_in_either_addressing_style() -> None:
    assert s3_target("https://b.s3.amazonaws.com/jobs/x/part%201.tsv", "PUT") == ("b", "jobs/x/part 1.tsv")
    assert s3_target("https://s3.amazonaws.com/b/jobs/x", "GET") == ("b", "jobs/x")
    assert s3_target("https://b.s3.amazonaws.com/?list-type=2&prefix=jobs%2Fx%2F", "GET") == ("b", "jobs/x/")


def test_a_signed_bedrock_request_is_a_call_of_its_step_shard_and_cause() -> None:
    ledger = CallLedger()
    causes.observe(ledger.occurred)
    signed: list[str] = []
    try:

        def sign(method: str, url: str, headers: Any, body: bytes | None) -> dict[str, str]:
            signed.append(url)
            return {"authorization": "AWS4-HMAC-SHA256 ..."}

        sending = ledger.signing(sign)
        url = "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-haiku/converse"
        with calling(Caller("run_shard", 3, "exec")), causes.because(causes.SIGNED):
            assert sending("POST", url, {}, b"{}") == {"authorization": "AWS4-HMAC-SHA256 ..."}
        with calling(Caller("run_shard", 3, "exec")):
            sending("POST", url.replace("/converse", "/invoke"), {}, b"{}")
    finally:
        causes.observe(None)
    assert signed == [url, url.replace("/converse", "/invoke")]
    first, second = ledger.calls
    assert (first.service, first.operation, first.step, first.shard) == ("bedrock-runtime", "Converse", "run_shard", 3)
    assert first.cause == causes.SIGNED.name
    assert [o.cause for o in ledger.occurrences] == [causes.SIGNED.name]
    # signed under no cause: the count's check sees a call with none
    assert (second.operation, second.cause) == ("InvokeModel", "")


def test_a_bedrock_batch_client_call_is_counted_even_when_refused() -> None:
    from botocore.exceptions import ClientError

    from sluice_local.cloud.bedrock_jobs import BedrockJobs

    ledger = CallLedger()
    jobs = BedrockJobs(lambda role: None)
    jobs.recorded = ledger.requested

    def refuse(action: str, resource: str) -> None:
        raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": action}}, action)

    with calling(Caller("collect_batch", 1)), causes.because(causes.POLL, period_s=60.0):
        assert jobs.client().list_model_invocation_jobs() == {"invocationJobSummaries": []}
        with pytest.raises(ClientError):
            jobs.client(refuse).get_model_invocation_job(jobIdentifier="arn:job")
    assert [(c.service, c.operation, c.step, c.cause) for c in ledger.calls] == [
        ("bedrock", "ListModelInvocationJobs", "collect_batch", causes.POLL.name),
        ("bedrock", "GetModelInvocationJob", "collect_batch", causes.POLL.name),
    ]
