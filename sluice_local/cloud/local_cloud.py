"""The local cloud itself: moto's services in this process, the deployed state machine on them,
and its Lambda calls answered by the handlers here, as each step's role, within AWS's quotas."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import importlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
from botocore.exceptions import ClientError
from moto import mock_aws
from sluice.contract import (
    INBOX_PREFIX,
    PROVIDER_STEPS,
    STEPS,
    ExecutionStatus,
    JobProgress,
    Settings,
    WebhookSettings,
)
from sluice.providers.signing import keyless, signed
from sluice.shard.progress import ProgressSink
from sluice.store.jobs import JobStore

from sluice_local import ledger, moto_patches, quotas
from sluice_local.cloud.bedrock_jobs import BedrockJobs, bedrock_jobs
from sluice_local.cloud.lambdas import (
    Invocation,
    LambdaContext,
    LambdaOutOfMemory,
    LambdaTimeout,
    RunInterrupted,
    lambda_error,
    step_environment,
)
from sluice_local.cloud.settings import LocalSettings
from sluice_local.cloud_names import (
    ACCOUNT,
    LOCAL_TTL_DAYS,
    PREFIX,
    REGION,
    create_table,
    function_arn,
    function_name,
    local_definition,
)
from sluice_local.dynamo_meter import MotoTables
from sluice_local.iam import service_role_arn
from sluice_local.quotas import MemoryBudget
from sluice_local.receiver import WebhookReceiver

# a local input above this is uploaded in parts of this size, and outputs downloaded in ranges of it
UPLOAD_PART_BYTES = 16 * 1024 * 1024


@dataclass
class LocalCloud:
    """moto S3, DynamoDB, Secrets Manager, EventBridge and Step Functions in this process."""

    provider_base_url: str
    api_key: str
    settings: LocalSettings = field(default_factory=LocalSettings)
    bucket: str = f"{PREFIX}-bucket"
    table_name: str = f"{PREFIX}-jobs"
    invocations: list[Invocation] = field(default_factory=list)
    # a test hook: called before every in-process Lambda call with the step and its payload
    before_invoke: Callable[[str, dict[str, Any]], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # the provider steps running now, and whether a signal stopped them taking lines (`stop_sending`)
    _provider_runs: set[LambdaContext] = field(default_factory=set)
    _draining: bool = False
    _stopped: threading.Event = field(default_factory=threading.Event)
    # what the provider signs webhooks with; local only, generated per run
    webhook_secret: str = field(default_factory=lambda: "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode())
    # filled in when the resources exist (`running`)
    secret_arn: str = ""
    webhook_secret_arn: str = ""
    state_machine_arn: str = ""
    webhook_url: str = ""
    receiver: WebhookReceiver | None = None
    # Amazon Bedrock's batch inference jobs, which moto has none of (`bedrock_jobs`), while running
    bedrock_jobs: BedrockJobs | None = None
    # each function's IAM statements (`sluice_local.iam`); None: the snapshot of the synthesized stack
    policies: dict[str, list[dict[str, Any]]] | None = None
    # while running: whether the role that signed a Bedrock request may invoke its model, as the
    # simulator asks it (`Simulator.authorize_invoke`): (access key, region, model) -> None or why not
    may_invoke: Callable[[str, str, str], str | None] | None = None
    # the built-in simulator the run sends to, if it does (a `SimulatorServer`): while the cloud
    # runs, it refuses a Bedrock request whose signer's role may not invoke the model
    simulator: Any = None
    # shards report each line here as it ends (`sluice run`'s display); no AWS request involved
    progress: ProgressSink | None = None
    # a user's Bedrock endpoint (`sluice_local.bedrock_endpoint`): the steps sign with the user's
    # credentials, not their roles' (which only the simulator knows)
    sign: Callable[..., dict[str, str]] | None = None
    # every AWS quota the run breached, and the figures measured against them
    quotas: quotas.Ledger = field(default_factory=quotas.Ledger)
    # every AWS call the run made, with its keys and capacity units (`bench/capacity.py` reads it)
    calls: ledger.CallLedger = field(default_factory=ledger.CallLedger)

    def environment(self) -> dict[str, str]:
        """What every in-process function reads: the steps' settings and the webhook receiver's."""
        chosen = {k: v for k, v in dataclasses.asdict(self.settings).items() if k != "lambda_timeout_s"}
        steps = Settings(
            bucket=self.bucket,
            table=self.table_name,
            provider_base_url=self.provider_base_url,
            api_key_secret_arn=self.secret_arn,
            ttl_days=LOCAL_TTL_DAYS,
            bedrock_batch_role_arn=service_role_arn(),
            **chosen,
        )
        webhook = WebhookSettings(
            table=self.table_name, webhook_secret_arn=self.webhook_secret_arn, ttl_days=LOCAL_TTL_DAYS
        )
        return {
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            **steps.to_env(),
            **webhook.to_env(),
            # Bedrock's runtime is where boto3's configuration says: here, the simulator's root
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": self.provider_base_url.rstrip("/").removesuffix("/v1"),
        }

    @contextmanager
    def running(self) -> Iterator[LocalCloud]:
        from sluice_handlers import webhook

        from sluice_local import iam

        moto_patches.check_version()
        # moto's interpreter logs every caught state failure at ERROR; the job's own outputs say it better
        logging.getLogger("moto").setLevel(logging.CRITICAL)
        with (
            mock.patch.dict(
                os.environ,
                {"AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"},
            ),
            mock_aws(config={"stepfunctions": {"execute_state_machine": True}}),
            mock.patch("boto3.DEFAULT_SESSION", iam.default_session()),
            moto_patches.parsed_once(),
        ):
            self._create_resources()
            policies = iam.load_policies() if self.policies is None else self.policies
            with (
                mock.patch.dict(os.environ, self.environment()),
                # every step as its own role, the cloud's own calls as an admin
                iam.enforced(policies, bucket=self.bucket) as local_iam,
                moto_patches.applied(
                    invoke=self._invoke,
                    workflow=local_iam.workflow,
                    ledger=self.quotas,
                    recorded=self.calls,
                    tables=MotoTables(ACCOUNT, REGION),
                ),
                quotas.enforced(self.quotas),
                WebhookReceiver(self._webhook(webhook.handler)) as receiver,
            ):
                self.calls.identities = _identities(local_iam)
                self.webhook_url = receiver.url
                self.receiver = receiver
                webhook._clients.cache_clear()
                self.bedrock_jobs = bedrock_jobs(local_iam, policies, self._webhook(webhook.handler))
                self.bedrock_jobs.recorded = self.calls.requested
                self.may_invoke = functools.partial(local_iam.may_invoke, policies)
                if self.simulator is not None:
                    self.simulator.simulator.authorize_invoke = self.may_invoke
                try:
                    yield self
                finally:
                    if self.simulator is not None:
                        self.simulator.simulator.authorize_invoke = None
                    self.bedrock_jobs.stop()
                    webhook._clients.cache_clear()

    def _create_resources(self) -> None:
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=self.bucket)
        create_table(boto3.client("dynamodb", region_name=REGION), self.table_name)
        secret = boto3.client("secretsmanager", region_name=REGION).create_secret(
            Name=f"{PREFIX}/provider-api-key", SecretString=self.api_key
        )
        self.secret_arn = secret["ARN"]
        webhook_secret = boto3.client("secretsmanager", region_name=REGION).create_secret(
            Name=f"{PREFIX}/webhook-signing-secret", SecretString=self.webhook_secret
        )
        self.webhook_secret_arn = webhook_secret["ARN"]
        sfn = boto3.client("stepfunctions", region_name=REGION)
        machine = sfn.create_state_machine(
            name=f"{PREFIX}-jobs",
            definition=local_definition(),
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/{PREFIX}-workflow",
        )
        self.state_machine_arn = machine["stateMachineArn"]

    def _invoke(self, parameters: dict[str, Any], region: str, state_credentials: Any) -> dict[str, Any]:
        """moto's Lambda call (see `moto_patches.routed`), answered by the handler in this process."""
        arn = parameters["FunctionName"]
        step = next(s for s in STEPS if function_arn(s) == arn)
        payload = json.loads(parameters.get("Payload") or b"{}")
        module = importlib.import_module(STEPS[step].module)
        started = time.monotonic()
        at = self.calls.now()
        execution = quotas.current_execution()
        caller = ledger.Caller(step, execution[1], execution[0]) if execution else ledger.Caller(step)
        measured: MemoryBudget | None = None
        cpu = 0.0
        with self._lock:
            warm = any(i.step == step for i in self.invocations)
        timeout = float(STEPS[step].timeout_s)
        if step in PROVIDER_STEPS:
            timeout = min(timeout, self.settings.lambda_timeout_s)
        try:
            request = quotas.json_size(parameters.get("Payload") or b"{}")
            if request > quotas.LAMBDA_PAYLOAD_BYTES:
                raise quotas.QuotaExceeded(self._breach("Lambda request payload", step, "was sent", request))
            if self.before_invoke is not None:
                self.before_invoke(step, payload)
            context = LambdaContext(
                function_name(step),
                timeout,
                self.calls.progress(self.progress),
                # the step's `bedrock` client: the local cloud's emulated batch jobs, under its grants
                bedrock=functools.partial(self.bedrock_jobs.client_for, step)
                if self.bedrock_jobs is not None
                else None,
                sign=self._signer(step),
            )
            context.environment = step_environment(step)
            self._admit(step, context)
            begun, cpu = time.monotonic(), time.thread_time()
            try:
                with (
                    # a cold start's imports and clients are the runtime's, not what the step holds
                    quotas.memory(self.quotas, step, trace=self.calls.trace_memory and warm) as memory,
                    quotas.invocation(self.quotas, step) as (fds, tmp),
                    ledger.calling(caller),
                ):
                    measured = memory
                    try:
                        result = module.handler(payload, context)
                    except asyncio.CancelledError as exc:
                        raise RunInterrupted(f"{step} gave up its requests in flight: the run was interrupted") from exc
            finally:
                with self._lock:
                    self._provider_runs.discard(context)
            elapsed, cpu = time.monotonic() - begun, time.thread_time() - cpu
            self._within_limits(step, timeout, elapsed, memory, fds.message or tmp.message)
            answer = json.loads(json.dumps(result))
            response = quotas.json_size(answer)
            if response > quotas.LAMBDA_PAYLOAD_BYTES:
                raise quotas.QuotaExceeded(self._breach("Lambda response payload", step, "returned", response))
        except Exception as exc:
            with self._lock:
                self.invocations.append(Invocation(step, time.monotonic() - started, repr(exc), payload=payload))
            self._ledgered(caller, at, time.monotonic() - started, measured, type(exc).__name__)
            return {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": lambda_error(exc)}
        with self._lock:
            self.invocations.append(Invocation(step, time.monotonic() - started, None, payload=payload))
        self._ledgered(caller, at, time.monotonic() - started, measured, "", cpu)
        return {"StatusCode": 200, "Payload": answer}

    def _signer(self, step: str) -> Callable[..., dict[str, str]] | None:
        """How a step signs Bedrock requests (the user's credentials, else its role's, as the
        handler would), each request written down in the ledger; None for a family with a key."""
        from sluice_handlers.runtime import session_for

        if not keyless(self.settings.provider):
            return None
        sign = self.sign
        if sign is None:
            found = signed(self.settings.provider, session_for(function_name(step)), os.environ)
            if found is None:
                return None
            sign = found[1]
        return self.calls.signing(sign)

    def _admit(self, step: str, context: LambdaContext) -> None:
        """A provider step counts among those running (`stop_sending`), unless the run was
        interrupted: then it starts nothing, and fails once the execution is stopped."""
        if step not in PROVIDER_STEPS:
            return
        with self._lock:
            draining = self._draining
            if not draining:
                self._provider_runs.add(context)
        if draining:
            # held until the execution is stopped, so the error reaches no state that would handle it
            self._stopped.wait(timeout=60)
            raise RunInterrupted(f"{step} not started: the run was interrupted")

    def _within_limits(
        self, step: str, timeout: float, elapsed: float, memory: MemoryBudget, sandbox: str | None
    ) -> None:
        """What Lambda would have stopped the handler for: its memory, its sandbox's descriptors
        or /tmp (`sandbox`, the message), its timeout."""
        if memory.message:
            raise LambdaOutOfMemory(memory.message)
        if sandbox:
            raise OSError(sandbox)
        if elapsed > timeout:
            raise LambdaTimeout(
                self.quotas.breach(
                    f"AWS quota: Lambda timeout for {step} is {timeout:g} s as configured; "
                    f"the handler ran {elapsed:.1f} s"
                )
            )

    def _ledgered(
        self,
        caller: ledger.Caller,
        at: float,
        seconds: float,
        memory: MemoryBudget | None,
        error: str,
        cpu: float = 0.0,
    ) -> None:
        held = memory.held(traced=self.calls.trace_memory) if memory is not None else None
        self.calls.invoked(caller, at, seconds, held, error, cpu)

    def _webhook(self, handler: Callable[[dict[str, Any], Any], dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        """The webhook function as API Gateway invokes it, its calls and invocations in the ledger."""
        caller = ledger.Caller("webhook")

        def invoked(event: dict[str, Any], context: Any) -> dict[str, Any]:
            at, begun, error = self.calls.now(), time.monotonic(), ""
            try:
                with ledger.calling(caller):
                    return handler(event, context)
            except Exception as exc:
                error = type(exc).__name__
                raise
            finally:
                self.calls.invoked(caller, at, time.monotonic() - begun, None, error)

        return invoked

    def stop_sending(self, stop: Callable[[], None]) -> None:
        """After a signal: the provider steps running take no new line and none starts again;
        `stop` stops the execution."""
        with self._lock:
            self._draining = True
            for context in self._provider_runs:
                context.end_now()
        try:
            stop()
        finally:
            self._stopped.set()

    def wait_for_runs(self, timeout_s: float, until: Callable[[], bool] | None = None) -> int:
        """Wait up to `timeout_s`, or until `until()`, for the provider steps running to checkpoint
        and end (their requests in flight answered, and filed in the response cache); how many
        are still going."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                left = len(self._provider_runs)
            if not left or time.monotonic() >= deadline or (until is not None and until()):
                return left
            time.sleep(0.05)

    def abandon(self, timeout_s: float) -> int:
        """Give up the requests still in flight, so that no answer arrives once the outputs are
        written; each provider step checkpoints what it was answered and ends. Returns how many
        are still going after `timeout_s`."""
        with self._lock:
            running = list(self._provider_runs)
        for context in running:
            context.abandon()
        return self.wait_for_runs(timeout_s)

    def _breach(self, what: str, step: str, verb: str, size: int) -> str:
        limit = quotas.LAMBDA_PAYLOAD_BYTES
        return self.quotas.breach(quotas.payload_message(f"{what} (synchronous)", limit, f"{step} {verb}", size))

    def upload(self, path: Path, *, key: str | None = None, metadata: dict[str, str] | None = None) -> tuple[str, str]:
        """`path` as the object `key`: a file above UPLOAD_PART_BYTES in parts, as the CLI's
        upload sends it, so that no request holds all of a large input in memory."""
        key = key or f"{INBOX_PREFIX}{path.name}"
        s3 = boto3.client("s3", region_name=REGION)
        with path.open("rb") as fh:
            if path.stat().st_size <= UPLOAD_PART_BYTES:
                answer = s3.put_object(Bucket=self.bucket, Key=key, Body=fh, Metadata=metadata or {})
                return key, answer["ETag"].strip('"')
            upload = s3.create_multipart_upload(Bucket=self.bucket, Key=key, Metadata=metadata or {})["UploadId"]
            parts: list[dict[str, Any]] = []
            while chunk := fh.read(UPLOAD_PART_BYTES):
                number = len(parts) + 1
                sent = s3.upload_part(Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number, Body=chunk)
                parts.append({"PartNumber": number, "ETag": sent["ETag"]})
        done = s3.complete_multipart_upload(
            Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
        )
        return key, done["ETag"].strip('"')

    def download(self, key: str, path: Path) -> bool:
        """The object `key` into the file `path`, a range at a time; False, and no file, where there
        is no such object (OSError if the file cannot be written)."""
        s3 = boto3.client("s3", region_name=REGION)
        try:
            size = s3.head_object(Bucket=self.bucket, Key=key)["ContentLength"]
        except ClientError:
            return False
        with path.open("wb") as out:
            for first in range(0, size, UPLOAD_PART_BYTES):
                last = min(first + UPLOAD_PART_BYTES, size) - 1
                got = s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={first}-{last}")
                out.write(got["Body"].read())
        return True

    def object_created_event(self, key: str, etag: str) -> dict[str, Any]:
        """What S3 sends to EventBridge, and the rule hands on to the state machine."""
        size = boto3.client("s3", region_name=REGION).head_object(Bucket=self.bucket, Key=key)["ContentLength"]
        return {
            "version": "0",
            "source": "aws.s3",
            "detail-type": "Object Created",
            "account": ACCOUNT,
            "region": REGION,
            "resources": [f"arn:aws:s3:::{self.bucket}"],
            "detail": {
                "version": "0",
                "bucket": {"name": self.bucket},
                "object": {"key": key, "size": size, "etag": etag},
                "reason": "PutObject",
            },
        }

    def start(self, event: dict[str, Any], *, name: str | None = None) -> str:
        sfn = boto3.client("stepfunctions", region_name=REGION)
        name = name or f"job-{time.time_ns()}"
        answer = sfn.start_execution(stateMachineArn=self.state_machine_arn, name=name, input=json.dumps(event))
        return str(answer["executionArn"])

    def wait(
        self, execution_arn: str, *, timeout_s: float = 3600, on_tick: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        sfn = boto3.client("stepfunctions", region_name=REGION)
        deadline = time.monotonic() + timeout_s
        while True:
            described = sfn.describe_execution(executionArn=execution_arn)
            if described["status"] != ExecutionStatus.RUNNING:
                return dict(described)
            if on_tick is not None:
                on_tick()
            if time.monotonic() > deadline:
                raise TimeoutError(f"execution still running after {timeout_s:.0f} s")
            # a describe is a dictionary lookup in this process; a job of a few lines ends in a second
            time.sleep(0.1)

    @functools.cached_property
    def _store(self) -> JobStore:
        # read as the cloud's admin, like the rest of the cloud's own calls
        return JobStore(boto3.resource("dynamodb", region_name=REGION).Table(self.table_name), ttl_days=1)

    def job(self, job_id: str) -> JobProgress | None:
        """The job row, with `done` and `failed` summed from its shard rows."""
        return self._store.job_progress(job_id)

    def read(self, key: str) -> bytes:
        return bytes(boto3.client("s3", region_name=REGION).get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def write(self, key: str, body: bytes) -> None:
        boto3.client("s3", region_name=REGION).put_object(Bucket=self.bucket, Key=key, Body=body)

    def keys(self, prefix: str) -> list[str]:
        """The bucket's keys under `prefix`."""
        pages = boto3.client("s3", region_name=REGION).get_paginator("list_objects_v2")
        return [
            o["Key"] for page in pages.paginate(Bucket=self.bucket, Prefix=prefix) for o in page.get("Contents", [])
        ]


def _identities(local_iam: Any) -> dict[str, str]:
    """Whose role each access key is: a step's, the webhook's, or the state machine's."""
    names = {function_name(step): step for step in [*STEPS, "webhook"]}
    found = {
        session.get_credentials().access_key: names.get(name, name) for name, session in local_iam.sessions.items()
    }
    if local_iam.workflow is not None:
        found[local_iam.workflow.get_credentials().access_key] = "workflow"
    return found
