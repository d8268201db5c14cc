"""Amazon Bedrock's batch inference jobs in the local cloud, which moto does not emulate: a stand-in
for boto3's `bedrock` client (the four job calls Sluice makes) over the local cloud's S3.

A job reads its input file as the service role it was passed (`service_s3`: an S3 client with that
role's credentials, so a role that may not read the input fails the job as on AWS), moves through
Submitted → InProgress → Completed as `run_pending` runs it, and writes `{jobId}/{file}.out` and
`manifest.json.out`. By option a job ends PartiallyCompleted (its last records get no row),
Expired (likewise), or Failed. Each end is announced as the "Batch Inference Job State Change"
event (source aws.bedrock) through `emit`.

Records are answered by the simulator's Messages answer function (`plan_messages`), not over HTTP:
a batch job does not draw on the on-demand rate limits the simulator's HTTP endpoints enforce, and
the answers then come the same whether or not a simulator listens. Given the simulator's settings
(`output_faults`), they carry its output faults too (off the schema, invalid JSON, cut short, refused).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from botocore.exceptions import ClientError

from sluice_local.cloud_names import ACCOUNT, REGION
from sluice_local.simulator.config import SimConfig
from sluice_local.simulator.messages import MESSAGES_PATH, plan_messages
from sluice_local.simulator.structured import pick_output_fault, spoil
from sluice_local.simulator.wire import ApiError

# Bedrock's default quota of batch inference jobs submitted or in progress at once per model
JOBS_PER_MODEL = 20

EVENT_SOURCE = "aws.bedrock"
EVENT_DETAIL_TYPE = "Batch Inference Job State Change"
# how a job ends when `run_pending` runs it
COMPLETED, PARTIAL, EXPIRED, FAILED = "Completed", "PartiallyCompleted", "Expired", "Failed"
# the prefixes of cross-region inference profiles' ids
_PROFILE_REGIONS = frozenset({"us", "eu", "apac", "us-gov", "global"})
_ENDED = frozenset({COMPLETED, PARTIAL, EXPIRED, FAILED, "Stopped"})

# whether the caller may do `action` on `resource`; raises the AccessDenied ClientError if not
Authorize = Callable[[str, str], None]
Emit = Callable[[dict[str, Any]], None]


def authorizer(statements: list[dict[str, Any]]) -> Authorize:
    """The caller's grants (its role's statements in `sluice_local/policies.json`) checked as IAM would:
    moto does not know Bedrock's actions, so the emulation asks `sluice_local.iam.allows` itself."""
    from sluice_local.iam import BEDROCK_SERVICE, allows

    def authorize(action: str, resource: str) -> None:
        if not allows(statements, action, resource, {"iam:PassedToService": BEDROCK_SERVICE}):
            raise _denied(action.split(":")[1], f"not authorized to perform: {action} on resource: {resource}")

    return authorize


def _denied(operation: str, message: str) -> ClientError:
    return ClientError({"Error": {"Code": "AccessDeniedException", "Message": message}}, operation)


def _not_found(operation: str, arn: str) -> ClientError:
    return ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": f"no job {arn}"}}, operation)


def _s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


@dataclass
class _Job:
    arn: str
    name: str
    model: str
    role: str
    token: str
    input_uri: str
    output_uri: str
    submitted: datetime
    status: str = "Submitted"
    message: str | None = None
    ended: datetime | None = None
    modified: datetime = field(default_factory=lambda: datetime.now(UTC))

    def described(self) -> dict[str, Any]:
        job: dict[str, Any] = {
            "jobArn": self.arn,
            "jobName": self.name,
            "modelId": self.model,
            "clientRequestToken": self.token,
            "roleArn": self.role,
            "status": self.status,
            "submitTime": self.submitted,
            "lastModifiedTime": self.modified,
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": self.input_uri, "s3InputFormat": "JSONL"}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": self.output_uri}},
        }
        if self.message:
            job["message"] = self.message
        if self.ended:
            job["endTime"] = self.ended
        return job


class BedrockJobs:
    """The batch inference jobs of one local account, shared by every function's client."""

    def __init__(
        self,
        service_s3: Callable[[str], Any],
        *,
        emit: Emit | None = None,
        ends: str = COMPLETED,
        jobs_per_model: int = JOBS_PER_MODEL,
    ) -> None:
        self._service_s3 = service_s3
        # Bedrock's quota of jobs submitted or in progress at once per model: a create past it is refused
        self.jobs_per_model = jobs_per_model
        # each function's statements, for `client_for`
        self.policies: dict[str, list[dict[str, Any]]] = {}
        self._emit = emit
        self.ends = ends
        # how many records of a PartiallyCompleted or Expired job get no row
        self.unanswered = 1
        # records answered with an error instead, by recordId: (errorCode, errorMessage)
        self.record_errors: dict[str, tuple[int, str]] = {}
        # the simulator's settings, whose output fault rates records are answered at; None: no faults
        self.output_faults: Callable[[], SimConfig] | None = None
        # each record's answers so far (by recordId), so one sent again in a later job draws afresh
        self._answered: dict[str, int] = {}
        self._jobs: dict[str, _Job] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._created = threading.Condition()
        self._worker: threading.Thread | None = None
        self._stopping = False
        # while set, the running cloud leaves its jobs Submitted (a test's job still open to cancel)
        self.paused = False
        # the local cloud's ledger (`sluice_local.ledger.CallLedger.requested`), which counts each client call
        self.recorded: Callable[[str, str], None] | None = None

    def start(self) -> None:
        """Run each job in a thread of its own as soon as it is created, as Bedrock would some
        time after: the shard that created it waits for its event (or polls) meanwhile."""

        def work() -> None:
            while True:
                with self._created:
                    self._created.wait_for(lambda: self._stopping or (not self.paused and self._pending()))
                    if self._stopping:
                        return
                self.run_pending()

        self._worker = threading.Thread(target=work, name="bedrock-jobs", daemon=True)
        self._worker.start()

    def stop(self) -> None:
        with self._created:
            self._stopping = True
            self._created.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=30)

    def _pending(self) -> bool:
        return any(job.status not in _ENDED for job in self.jobs())

    def client(self, authorize: Authorize | None = None) -> BedrockClient:
        """A `bedrock` client for one caller, whose grants `authorize` checks."""
        return BedrockClient(self, authorize or (lambda action, resource: None))

    def client_for(self, step: str) -> BedrockClient:
        """The `bedrock` client of a step's function, under its role's statements."""
        return self.client(authorizer(self.policies.get(step, [])))

    def _create(self, **kwargs: Any) -> dict[str, Any]:
        with self._lock:
            for job in self._jobs.values():
                if job.token == kwargs["clientRequestToken"]:
                    return {"jobArn": job.arn}
            model = kwargs["modelId"]
            running = sum(1 for job in self._jobs.values() if job.model == model and job.status not in _ENDED)
            if running >= self.jobs_per_model:
                raise ClientError(
                    {
                        "Error": {
                            "Code": "ServiceQuotaExceededException",
                            "Message": f"{running} batch inference jobs of {model} are submitted or "
                            "in progress, the quota of concurrent jobs for the model",
                        }
                    },
                    "CreateModelInvocationJob",
                )
            job_id = f"{next(self._ids):012d}"
            arn = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:model-invocation-job/{job_id}"
            now = datetime.now(UTC)
            self._jobs[arn] = _Job(
                arn=arn,
                name=kwargs["jobName"],
                model=kwargs["modelId"],
                role=kwargs["roleArn"],
                token=kwargs["clientRequestToken"],
                input_uri=kwargs["inputDataConfig"]["s3InputDataConfig"]["s3Uri"],
                output_uri=kwargs["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"],
                submitted=now,
                modified=now,
            )
        with self._created:
            self._created.notify_all()
        return {"jobArn": arn}

    def job(self, arn: str, operation: str = "GetModelInvocationJob") -> _Job:
        with self._lock:
            found = self._jobs.get(arn)
        if found is None:
            raise _not_found(operation, arn)
        return found

    def jobs(self) -> list[_Job]:
        with self._lock:
            return list(self._jobs.values())

    def run_pending(self) -> int:
        """Run every job not yet ended to its end; how many ended."""
        ran = 0
        for job in self.jobs():
            if job.status not in _ENDED:
                try:
                    self._run(job)
                except Exception as exc:  # a job that broke the emulation ends failed, as on AWS
                    self._set(job, FAILED, f"the local cloud's emulation failed: {exc!r}")
                ran += 1
        return ran

    def _set(self, job: _Job, status: str, message: str | None = None) -> None:
        job.status, job.modified = status, datetime.now(UTC)
        if message:
            job.message = message
        if status in _ENDED:
            job.ended = job.modified
        if self._emit is not None:
            try:
                self._emit(self.event(job))
            except Exception:  # EventBridge's delivery is not the job's: a lost event leaves polling
                logging.getLogger(__name__).warning("%s event of %s not delivered", status, job.arn, exc_info=True)

    def _run(self, job: _Job) -> None:
        s3 = self._service_s3(job.role)
        bucket, key = _s3(job.input_uri)
        try:
            raw = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as exc:
            self._set(job, FAILED, f"the service role could not read the input {job.input_uri}: {exc}")
            return
        if job.status == "Stopping":
            self._set(job, "Stopped")
            return
        self._set(job, "InProgress")
        if self.ends == FAILED:
            self._set(job, FAILED, "failed by the local cloud's option")
            return
        rows = [orjson.loads(line) for line in raw.splitlines() if line.strip()]
        skipped = self.unanswered if self.ends in (PARTIAL, EXPIRED) else 0
        answered = rows[: len(rows) - skipped] if skipped else rows
        out = [self._answer(job, row) for row in answered]
        if job.status == "Stopping":
            # stopped while it ran: a stopped job hands back nothing, as a late one on a bad day
            self._set(job, "Stopped")
            return
        prefix = f"{job.output_uri.rstrip('/')}/{job.arn.rsplit('/', 1)[-1]}/"
        out_bucket, out_key = _s3(prefix)
        errors = sum("error" in row for row in out)
        manifest = {
            "totalRecordCount": len(rows),
            "processedRecordCount": len(out),
            "successRecordCount": len(out) - errors,
            "errorRecordCount": errors,
        }
        try:
            s3.put_object(
                Bucket=out_bucket,
                Key=out_key + key.rsplit("/", 1)[-1] + ".out",
                Body=b"".join(orjson.dumps(row) + b"\n" for row in out),
            )
            s3.put_object(Bucket=out_bucket, Key=out_key + "manifest.json.out", Body=orjson.dumps(manifest))
        except ClientError as exc:
            self._set(job, FAILED, f"the service role could not write the output {prefix}: {exc}")
            return
        self._set(job, self.ends)

    def _answer(self, job: _Job, row: dict[str, Any]) -> dict[str, Any]:
        model_input = row.get("modelInput")
        record = {"recordId": row.get("recordId"), "modelInput": model_input}
        if str(row.get("recordId")) in self.record_errors:
            code, message = self.record_errors[str(row.get("recordId"))]
            return {**record, "error": {"errorCode": code, "errorMessage": message}}
        try:
            if not isinstance(model_input, dict):
                raise ApiError(400, "modelInput: a JSON object")
            plan = plan_messages({**model_input, "model": job.model}, _new_id(row))
        except ApiError as exc:
            return {**record, "error": {"errorCode": exc.status, "errorMessage": str(exc)}}
        if self.output_faults is not None and plan.reply is not None:
            config, key = self.output_faults(), f"bedrockrow:{row.get('recordId')}"
            attempt = self._answered[key] = self._answered.get(key, 0) + 1
            spoil(plan.reply, pick_output_fault(config, config.seed, key, attempt), MESSAGES_PATH, model_input)
        return {**record, "modelOutput": plan.build()}

    @staticmethod
    def event(job: _Job) -> dict[str, Any]:
        """The EventBridge event Bedrock sends as a job changes state."""
        return {
            "source": EVENT_SOURCE,
            "detail-type": EVENT_DETAIL_TYPE,
            "account": ACCOUNT,
            "region": REGION,
            "resources": [job.arn],
            "detail": {
                "batchJobArn": job.arn,
                "batchJobName": job.name,
                "accountId": ACCOUNT,
                "status": job.status,
            },
        }


def _new_id(row: dict[str, Any]) -> Callable[[str], str]:
    def new_id(prefix: str) -> str:
        return f"{prefix}_{hashlib.sha256(str(row.get('recordId')).encode()).hexdigest()[:16]}"

    return new_id


def _model_arn(model: str) -> str:
    if model.startswith("arn:"):
        return model
    if model.split(".", 1)[0] in _PROFILE_REGIONS:
        return f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/{model}"
    return f"arn:aws:bedrock:{REGION}::foundation-model/{model}"


class BedrockClient:
    """What Sluice calls of boto3's `bedrock` client, on the local cloud's jobs."""

    def __init__(self, jobs: BedrockJobs, authorize: Authorize) -> None:
        self._jobs = jobs
        self._grants = authorize

    def _authorize(self, action: str, resource: str) -> None:
        # a request refused is a request made: the ledger counts it before its grant is checked
        service, _, operation = action.partition(":")
        if service == "bedrock" and self._jobs.recorded is not None:
            self._jobs.recorded(service, operation)
        self._grants(action, resource)

    def create_model_invocation_job(self, **kwargs: Any) -> dict[str, Any]:
        self._authorize("bedrock:CreateModelInvocationJob", _model_arn(str(kwargs["modelId"])))
        role = str(kwargs["roleArn"])
        try:
            self._authorize("iam:PassRole", role)
        except ClientError as exc:
            raise _denied("CreateModelInvocationJob", f"not authorized to perform iam:PassRole on {role}") from exc
        return self._jobs._create(**kwargs)

    def get_model_invocation_job(self, *, jobIdentifier: str) -> dict[str, Any]:
        self._authorize("bedrock:GetModelInvocationJob", jobIdentifier)
        return self._jobs.job(jobIdentifier).described()

    def list_model_invocation_jobs(self, **kwargs: Any) -> dict[str, Any]:
        self._authorize("bedrock:ListModelInvocationJobs", "*")
        since = kwargs.get("submitTimeAfter")
        if isinstance(since, (int, float)):
            since = datetime.fromtimestamp(since, UTC)
        found = [
            job.described()
            for job in self._jobs.jobs()
            if kwargs.get("nameContains", "") in job.name
            and kwargs.get("statusEquals", job.status) == job.status
            and (since is None or job.submitted >= since)
        ]
        return {"invocationJobSummaries": found}

    def stop_model_invocation_job(self, *, jobIdentifier: str) -> dict[str, Any]:
        self._authorize("bedrock:StopModelInvocationJob", jobIdentifier)
        job = self._jobs.job(jobIdentifier, "StopModelInvocationJob")
        if job.status in _ENDED:
            raise ClientError(
                {"Error": {"Code": "ValidationException", "Message": f"the job has ended {job.status}"}},
                "StopModelInvocationJob",
            )
        self._jobs._set(job, "Stopped" if job.status == "Submitted" else "Stopping")
        return {}


def bedrock_jobs(local_iam: Any, policies: dict[str, list[dict[str, Any]]], webhook: Callable[..., Any]) -> BedrockJobs:
    """The local cloud's jobs, running: read and written as the service role's session, their
    ends delivered to the webhook function as EventBridge's rule would."""
    from sluice_local.receiver import WebhookContext

    service = local_iam.bedrock_batch

    def service_s3(role: str) -> Any:
        from sluice_local.iam import service_role_arn

        if service is None or role != service_role_arn():
            raise _denied("CreateModelInvocationJob", f"Bedrock cannot assume {role}")
        return service.client("s3")

    def emit(event: dict[str, Any]) -> None:
        if event["detail"]["status"] in _ENDED:
            webhook(event, WebhookContext())

    jobs = BedrockJobs(service_s3, emit=emit)
    jobs.policies = policies
    jobs.start()
    return jobs
