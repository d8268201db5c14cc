"""Where things are: the table's keys and index, the bucket's key layout, the metrics' names."""

from __future__ import annotations

import hashlib
import urllib.parse
from typing import Any

PARTITION_KEY = "pk"
SORT_KEY = "sk"
TTL_ATTRIBUTE = "expires_at"
# Sparse: only items and shards handed to a provider carry it, so a webhook finds its row
# without the index holding every row.
PROVIDER_ID_ATTRIBUTE = "provider_id"
PROVIDER_ID_INDEX = "by_provider_id"
# what the index copies of a row: its keys, all its one reader (`JobStore._by_provider_id`) uses
PROVIDER_ID_PROJECTION = "KEYS_ONLY"
# A line's row keeps its background response's id under a name of its own, off the index: a
# webhook finds the line by the response's pointer row (`keys.response_key`), so an index entry a
# line was a second write of every item write, the table's largest at a key's full rate
ITEM_RESPONSE_ATTRIBUTE = "response_id"


def create_table_request(name: str) -> dict[str, Any]:
    """DynamoDB CreateTable's arguments for the jobs table, the keys and index infra/storage.py declares."""
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": attribute, "AttributeType": "S"}
            for attribute in (PARTITION_KEY, SORT_KEY, PROVIDER_ID_ATTRIBUTE)
        ],
        "KeySchema": [
            {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": PROVIDER_ID_INDEX,
                "KeySchema": [{"AttributeName": PROVIDER_ID_ATTRIBUTE, "KeyType": "HASH"}],
                "Projection": {"ProjectionType": PROVIDER_ID_PROJECTION},
            }
        ],
    }


# users drop inputs here (the EventBridge rule matches `inbox/*.jsonl`) ...
INBOX_PREFIX = "inbox/"
# ... each job keeps its working files under jobs/<job id>/ ...
JOBS_PREFIX = "jobs/"
# ... and the merged outputs appear here
OUTBOX_PREFIX = "outbox/"
# the response cache's segments and indexes (`sluice.cache.entries`), expired after `cache_ttl_days`
CACHE_PREFIX = "cache/"
# the batch turnarounds measured of earlier jobs, one small object per provider family and model
# (`turnarounds_key`): kept across jobs, so no lifecycle rule expires them
TURNAROUNDS_PREFIX = "turnarounds/"
# Amazon Bedrock batch inference reads its jobs' input files here and writes their answers there;
# its service role may read only the one and write only the other
BEDROCK_BATCH_PREFIX = "bedrock-batch/"
BEDROCK_INPUT_PREFIX = f"{BEDROCK_BATCH_PREFIX}input/"
BEDROCK_OUTPUT_PREFIX = f"{BEDROCK_BATCH_PREFIX}output/"
# Bedrock's rule for a job's name: 1 to 63 characters, letters and digits joined by `-`, `+` or `.`
BEDROCK_JOB_NAME_PATTERN = r"[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}"
BEDROCK_JOB_NAME_MAX = 63
# how much of a job's name the environment's part may take: the rest names the job, shard, part and
# attempt (`sluice.providers.bedrock.batch.job_name`)
_ENVIRONMENT_TOKEN_MAX = 16
_ENVIRONMENT_DIGEST = 6


def bedrock_job_name_prefix(environment: str) -> str:
    """How every Bedrock batch inference job of the environment's stack (`Sluice-<environment>`) is
    named: the rule that hears job state changes matches it, so a stack hears its own jobs and not
    those of another environment in the same account, and a listing of its jobs lists only those.

    The environment's part is letters and digits only, then `-`: no environment's prefix can begin
    another's. A name with other characters, or longer than fits, is cut and ends in a digest of the
    whole name instead, so that two environments never share a prefix."""
    token = "".join(c for c in environment if c.isascii() and c.isalnum())
    if token != environment or len(token) > _ENVIRONMENT_TOKEN_MAX:
        digest = hashlib.sha256(environment.encode()).hexdigest()[:_ENVIRONMENT_DIGEST]
        token = token[: _ENVIRONMENT_TOKEN_MAX - _ENVIRONMENT_DIGEST] + digest
    return f"sluice-{token}-"


# what a local run's jobs are named by (a local cloud's environment is `local`)
LOCAL_BEDROCK_JOB_NAME_PREFIX = bedrock_job_name_prefix("local")


def job_prefix(job_id: str) -> str:
    return f"{JOBS_PREFIX}{job_id}/"


def manifest_key(job_id: str) -> str:
    """The shards Plan wrote, which the Distributed Map reads."""
    return f"{job_prefix(job_id)}manifest.json"


def deadline_plan_key(job_id: str) -> str:
    """A deadline job's plan (`sluice.plan.deadline_choice`): each shard's choice and why, for the summary."""
    return f"{job_prefix(job_id)}deadline.json"


def turnarounds_key(family: str, model: str) -> str:
    """The batch turnarounds measured of `family`'s `model` (`sluice.plan.turnarounds`): Merge adds
    a job's, a deadline job's Plan reads them. The model is quoted whole: a Bedrock model may be an
    ARN, whose slashes and colons would otherwise cut the key."""
    return f"{TURNAROUNDS_PREFIX}{urllib.parse.quote(family, safe='')}/{urllib.parse.quote(model, safe='')}.json"


def shard_prefix(job_id: str, shard: int) -> str:
    """One shard's working files: its checkpoint parts, then its results, errors and stats."""
    return f"{job_prefix(job_id)}shards/{shard:05d}/"


# every shard's working files of every job, for a grant that cannot name the job
ANY_SHARD_PREFIX = f"{job_prefix('*')}shards/*/"

# A job's outputs are `<output prefix><suffix>`: outbox/<name> deployed, <--out>/<name> locally.
OUTPUT_SUFFIXES: dict[str, str] = {"results": ".results.jsonl", "errors": ".errors.jsonl", "summary": ".summary.json"}
# the HTML report `sluice run` and `sluice results` write beside them
REPORT_SUFFIX = ".report.html"


def output_key(prefix: str, kind: str) -> str:
    """One of a job's outputs (`results`, `errors`, `summary`) under its output prefix."""
    return prefix + OUTPUT_SUFFIXES[kind]


def summary_key(prefix: str) -> str:
    return output_key(prefix, "summary")


# a job refused because its input key's job still runs writes only its summary, beside the key's
REFUSED_MARK = ".refused-"


def refused_prefix(prefix: str, job_id: str) -> str:
    return f"{prefix}{REFUSED_MARK}{job_id}"


def refused_summaries(prefix: str) -> str:
    """Every refused job's summary under `prefix`, as an IAM resource pattern."""
    return f"{prefix}*{REFUSED_MARK}*{OUTPUT_SUFFIXES['summary']}"


# the EMF namespace of every metric, and the `service` dimension
METRICS_NAMESPACE = "Sluice"
SERVICE = "sluice"
# the job-end metrics the alarms watch: a job whose failed lines passed its max_error_rate (or that
# answered none of its lines), and a job Plan refused for what the user asked (not a fault of ours)
JOBS_OVER_ERROR_RATE = "JobsOverErrorRate"
JOBS_REFUSED = "JobsRefused"
# the `environment` dimension: the deployment (`dev`, `prod`, `local`), so two never mix
ENVIRONMENT_VARIABLE = "SLUICE_ENV"
