"""Amazon Bedrock batch inference behind the batch runners: `BedrockBatchApi` against the local
cloud's emulated jobs (`sluice_local.cloud.bedrock_jobs`) on moto's S3.

A part of at least Bedrock's 100 records runs as a job and its answers come back chat.completion
shaped for chat lines; a part below 100 goes direct; a PartiallyCompleted job's records with no
answer go direct, as an expired OpenAI batch's do.
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import replace
from typing import Any

import orjson
import pytest
from sluice.contract import BEDROCK_INPUT_PREFIX, BEDROCK_OUTPUT_PREFIX
from sluice.contract.model import Request
from sluice.providers.apis import batch_limits
from sluice.providers.batch import BatchLimits, BatchTag, BatchUpload, QueueFull
from sluice.providers.bedrock import batch as bedrock
from sluice.providers.bedrock.format import BEDROCK
from sluice.providers.bedrock.records import dialect, model_input, output_row
from sluice.providers.format import Unsupported
from sluice.runners.batch.submit import collect_batch, submit_batch
from sluice.runners.cancel import ProviderWork, cancel_at_provider
from sluice.shard.frame import pending
from sluice.shard.parts import load_checkpoint

from sluice_local.cloud.bedrock_jobs import EXPIRED, PARTIAL
from tests.unit.helpers.batch_runner import BUCKET
from tests.unit.helpers.batch_runner import env as env  # the fixture
from tests.unit.helpers.bedrock_batch import MODEL, ROLE, Bedrock
from tests.unit.helpers.bedrock_batch import bed as bed

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"


def test_a_part_of_at_least_a_hundred_records_runs_as_one_job(bed: Bedrock) -> None:
    spec = bed.shard(120)
    (job_arn,) = asyncio.run(submit_batch(bed.env.ctx, spec)).batch_ids
    (job,) = bed.jobs.jobs()
    assert (job.arn, job.model, job.role, job.status) == (job_arn, MODEL, ROLE, "Submitted")
    assert job.input_uri.startswith(f"s3://{BUCKET}/{BEDROCK_INPUT_PREFIX}")
    assert asyncio.run(collect_batch(bed.env.ctx, spec)).waiting == 1

    assert bed.jobs.run_pending() == 1
    assert [(e["detail-type"], e["detail"]["status"]) for e in bed.events] == [
        ("Batch Inference Job State Change", "InProgress"),
        ("Batch Inference Job State Change", "Completed"),
    ]
    assert asyncio.run(collect_batch(bed.env.ctx, spec)).done is True
    results, errors = bed.env.outputs(spec)
    assert errors == [] and len(results) == 120
    assert [r["custom_id"] for r in results] == [f"u-{n}" for n in range(120)]
    body = results[0]["response"]["body"]
    # a chat line's answer reads as OpenAI's, whichever provider gave it
    assert body["object"] == "chat.completion" and body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] > 0 and body["choices"][0]["message"]["content"]
    # the job's files are deleted once its answers are in the results
    assert bed.objects(BEDROCK_INPUT_PREFIX) == [] and bed.objects(BEDROCK_OUTPUT_PREFIX) == []


def test_a_part_below_bedrocks_minimum_goes_direct(bed: Bedrock) -> None:
    # 150 lines cut at 100 a job: the 50 left over are too few for Bedrock
    bed.env.ctx = replace(
        bed.env.ctx,
        batch_api=bedrock.opener(
            bed.jobs.client,
            bed.env.s3,
            bucket=BUCKET,
            role_arn=ROLE,
            limits=BatchLimits(max_records=100, max_bytes=bedrock.MAX_BYTES, min_records=bedrock.MIN_RECORDS),
        ),
    )
    spec = bed.shard(150)
    asyncio.run(submit_batch(bed.env.ctx, spec))
    assert len(bed.jobs.jobs()) == 1
    bed.jobs.run_pending()
    outcome = asyncio.run(collect_batch(bed.env.ctx, spec))
    assert (outcome.done, outcome.fallback) == (False, True)
    done = load_checkpoint(bed.env.s3, spec).done
    assert [r.line for r in pending(bed.env.s3, spec, done, lambda e: None)] == list(range(101, 151))


def test_lines_of_a_model_bedrock_batch_cannot_take_go_direct_instead_of_failing_the_shard(bed: Bedrock) -> None:
    # Bedrock batch writes Anthropic models' bodies only; Converse, the direct pass, takes any model
    spec = replace(bed.shard(120), model="amazon.nova-lite-v1:0")
    asyncio.run(submit_batch(bed.env.ctx, spec))
    assert bed.jobs.jobs() == []
    outcome = asyncio.run(collect_batch(bed.env.ctx, spec))
    assert (outcome.done, outcome.fallback) == (False, True)
    done = load_checkpoint(bed.env.s3, spec).done
    assert [r.line for r in pending(bed.env.s3, spec, done, lambda e: None)] == list(range(1, 121))


@pytest.mark.parametrize("ending", [PARTIAL, EXPIRED])
def test_records_a_job_left_unanswered_go_direct(bed: Bedrock, ending: str) -> None:
    bed.jobs.ends, bed.jobs.unanswered = ending, 3
    spec = bed.shard(100)
    asyncio.run(submit_batch(bed.env.ctx, spec))
    bed.jobs.run_pending()
    outcome = asyncio.run(collect_batch(bed.env.ctx, spec))
    assert (outcome.done, outcome.fallback) == (False, True)
    done = load_checkpoint(bed.env.s3, spec).done
    assert [r.custom_id for r in pending(bed.env.s3, spec, done, lambda e: None)] == ["u-97", "u-98", "u-99"]
    assert bed.env.report(spec)["fallback_lines"] == 3

    # or, when the job's policy says so, as errors named by how the job ended
    reported = bed.shard(100, shard=1, on_batch_incomplete="error")
    asyncio.run(submit_batch(bed.env.ctx, reported))
    bed.jobs.run_pending()
    assert asyncio.run(collect_batch(bed.env.ctx, reported)).done is True
    code = "batch_expired" if ending == EXPIRED else "batch_failed"
    assert [e["error"]["code"] for e in bed.env.outputs(reported)[1]] == [code] * 3


def test_a_retried_submit_finds_the_job_it_created(bed: Bedrock) -> None:
    spec = bed.shard(100)
    (first,) = asyncio.run(submit_batch(bed.env.ctx, spec)).batch_ids

    async def find() -> dict[BatchTag, str]:
        async with bed.env.ctx.batches() as api:
            return await api.find(spec.job_id, spec.shard, since=0)

    assert asyncio.run(find()) == {BatchTag(spec.job_id, 0, 0): first}
    assert asyncio.run(submit_batch(bed.env.ctx, spec)).batch_ids == [first]
    assert len(bed.jobs.jobs()) == 1


class CountingClient:
    """The emulated Bedrock client, counting the calls made of it by name."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._client, name)
        if not callable(found):
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return found(*args, **kwargs)

        return counted


def test_a_model_with_its_concurrent_jobs_running_refuses_another_and_nothing_lists_the_accounts_jobs(
    bed: Bedrock,
) -> None:
    """Bedrock's refusal of a create past its quota is the count: a submit makes one create call,
    not a listing of every job in the account first (five paginated calls an attempt)."""
    bed.jobs.jobs_per_model = 1
    limits = BatchLimits(max_records=bedrock.MAX_RECORDS, max_bytes=bedrock.MAX_BYTES)
    client = CountingClient(bed.jobs.client())
    api = bedrock.BedrockBatchApi(client, bed.env.s3, bucket=BUCKET, role_arn=ROLE, limits=limits)
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    row = api.encode(Request(1, "a", "POST", "/v1/messages", orjson.dumps(body)))

    def upload() -> BatchUpload:
        return BatchUpload(io.BytesIO(row), "/v1/messages", MODEL, rows=1, size=len(row))

    asyncio.run(api.submit(upload(), BatchTag("j", 0, 0)))
    with pytest.raises(QueueFull):
        asyncio.run(api.submit(upload(), BatchTag("j", 0, 1)))
    assert client.calls == ["create_model_invocation_job"] * 2
    # the refused part's input stays staged for its next attempt (`test_bedrock_staged_part`)
    assert len(bed.objects(BEDROCK_INPUT_PREFIX)) == 2


def test_a_cancel_stops_the_job(bed: Bedrock) -> None:
    spec = bed.shard(100, on_batch_incomplete="error")
    (job_arn,) = asyncio.run(submit_batch(bed.env.ctx, spec)).batch_ids
    work = ProviderWork(batches=[job_arn])
    answers = asyncio.run(cancel_at_provider(work, base_url="-", api_key="-", batch_api=bed.env.ctx.batch_api))
    assert answers.batches_cancelled == 1
    assert asyncio.run(collect_batch(bed.env.ctx, spec)).done is True
    assert {e["error"]["code"] for e in bed.env.outputs(spec)[1]} == {"batch_cancelled"}


def test_a_model_input_is_the_invoke_model_body_of_an_anthropic_model() -> None:
    chat = {"model": MODEL, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}
    wire = model_input(Request(1, "a", "POST", "/v1/chat/completions", orjson.dumps(BEDROCK.to_wire(CHAT, chat))))
    assert wire == {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 4096,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    native = {"model": "us." + MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    assert "model" not in model_input(Request(1, "a", "POST", "/v1/messages", orjson.dumps(native)))
    other = {"model": "amazon.nova-lite-v1:0", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(Unsupported, match="Anthropic models only"):
        model_input(Request(1, "a", "POST", "/v1/chat/completions", orjson.dumps(BEDROCK.to_wire(CHAT, other))))


def test_a_chat_lines_converse_body_is_written_as_the_same_messages_request() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}],
        "max_tokens": 20,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": "END",
        "tools": [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}],
        "tool_choice": "required",
    }
    wire = model_input(Request(1, "a", "POST", CHAT, orjson.dumps(BEDROCK.to_wire(CHAT, chat))))
    assert wire == {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 20,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop_sequences": ["END"],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is it?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
                ],
            }
        ],
        "tools": [{"name": "look", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"},
    }


def test_a_responses_line_is_written_as_messages_and_answered_as_a_response() -> None:
    line = {"model": MODEL, "input": "hi", "instructions": "Be brief.", "max_output_tokens": 5}
    wire = model_input(Request(1, "a", "POST", RESPONSES, orjson.dumps(BEDROCK.to_wire(RESPONSES, line))))
    assert wire == {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 5,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    key = bedrock.input_key(BatchTag("job", 0, 0), RESPONSES)
    assert dialect(key) == RESPONSES
    answer = {
        "id": "msg_1",
        "type": "message",
        "model": MODEL,
        "content": [{"type": "text", "text": "positive"}],
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 7, "output_tokens": 5},
    }
    row = output_row({"recordId": "R0000000001", "modelOutput": answer}, dialect(key), 1700000000)
    assert row is not None and row.status_code == 200
    assert row.body["object"] == "response" and row.body["created_at"] == 1700000000
    assert (row.body["status"], row.body["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert row.body["output"][0]["content"] == [{"type": "output_text", "text": "positive", "annotations": []}]
    assert row.body["usage"]["total_tokens"] == 12


def test_a_records_error_is_its_lines_error_unless_another_try_may_answer_it(bed: Bedrock) -> None:
    # line 1 refused for good (400); line 2 throttled (429): that one goes direct
    bed.jobs.record_errors = {"R0000000001": (400, "messages: bad turn order"), "R0000000002": (429, "slow down")}
    spec = bed.shard(100)
    asyncio.run(submit_batch(bed.env.ctx, spec))
    bed.jobs.run_pending()
    outcome = asyncio.run(collect_batch(bed.env.ctx, spec))
    assert (outcome.done, outcome.fallback) == (False, True)
    done = load_checkpoint(bed.env.s3, spec).done
    assert [r.custom_id for r in pending(bed.env.s3, spec, done, lambda e: None)] == ["u-1"]

    # reported instead, the throttled line says the batch did not run it; the other, what Bedrock said
    reported = bed.shard(100, shard=1, on_batch_incomplete="error")
    asyncio.run(submit_batch(bed.env.ctx, reported))
    bed.jobs.run_pending()
    assert asyncio.run(collect_batch(bed.env.ctx, reported)).done is True
    errors = bed.env.outputs(reported)[1]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("u-0", "provider_error"),
        ("u-1", "batch_failed"),
    ]
    assert errors[0]["response"]["status_code"] == 400 and "bad turn order" in errors[0]["error"]["message"]


def test_sluice_holds_half_bedrocks_jobs_a_model_and_an_eleventh_part_waits_for_a_slot(bed: Bedrock) -> None:
    """Each part holds one of the batch queue's job slots before its job is created, and the slots
    hold half the quota (20 by default), so Bedrock's own refusal is never what stops Sluice."""
    deployed = replace(bed.env.ctx.settings, provider="bedrock")
    assert batch_limits(replace(deployed, bedrock_batch_jobs_quota=30)).max_jobs == 15
    assert batch_limits(deployed).max_jobs == bedrock.LIMITS.max_jobs == 10
    specs = [bed.shard(100, shard=n) for n in range(11)]
    submitted = [asyncio.run(submit_batch(bed.env.ctx, spec)) for spec in specs]
    assert [len(s.batch_ids) for s in submitted] == [1] * 10 + [0]
    assert len(bed.jobs.jobs()) == 10
    assert asyncio.run(collect_batch(bed.env.ctx, specs[10])).done is False
    assert len(bed.jobs.jobs()) == 10
    # the first job ends and its collect gives its slot back: the eleventh part goes
    bed.jobs.run_pending()
    assert asyncio.run(collect_batch(bed.env.ctx, specs[0])).done is True
    asyncio.run(collect_batch(bed.env.ctx, specs[10]))
    assert len(bed.jobs.jobs()) == 11
