"""The modes a job runs in, its options, and the status words of jobs, shards and executions."""

from __future__ import annotations


class Mode:
    """How a job's shards send their lines (`sluice-mode`, `Settings.default_mode`)."""

    # each request through the fan-out engine
    DIRECT = "direct"
    # Responses with `background: true`, collected as they settle
    BACKGROUND = "background"
    # the provider's Batch API
    BATCH = "batch"
    # Plan picks direct or batch for each shard by its size (`Settings.auto_batch_min_requests`)
    AUTO = "auto"


MODES = (Mode.DIRECT, Mode.BACKGROUND, Mode.BATCH, Mode.AUTO)
# what happens to rows a batch did not finish: `direct` re-runs them, `error` reports them
BATCH_INCOMPLETE_POLICIES = ("direct", "error")
SHARED_LIMIT_CHOICES = ("on", "off")
VALIDATE_REPAIR_CHOICES = ("on", "off")
# the response cache per job: `on` reads and fills it, `read` only reads, `write` only fills
CACHE_MODES = ("on", "read", "write", "off")
# the provider families Sluice speaks (`sluice.providers.family`): `Settings.provider` picks one
DEFAULT_PROVIDER = "openai"
BEDROCK_PROVIDER = "bedrock"
PROVIDERS = (DEFAULT_PROVIDER, "anthropic", BEDROCK_PROVIDER, "gemini")
# the families that sign each request with the function's AWS credentials: an environment of one
# holds no API key, and its functions read the secret named by NO_API_KEY_SECRET never
SIGNED_PROVIDERS = frozenset({BEDROCK_PROVIDER})
NO_API_KEY_SECRET = "none"
# what per-line output validation can check of an answer (`sluice.formats.validation`); `all` (or the
# option given bare) turns on every one, and each applies to a line only where it can
VALIDATION_CHECKS = ("json", "schema", "cut_short", "refusal", "empty")
VALIDATE_ALL = "all"
VALIDATE_NONE = ("", "none", "off")


def parse_validate(text: str) -> tuple[str, ...]:
    """The checks a `--validate` / `sluice-validate` value turns on, in `VALIDATION_CHECKS`' order:
    `all` every one, `none`/`off`/"" none, else names separated by commas."""
    words = {w.strip().lower() for w in text.split(",")} - {""}
    if not words or words <= set(VALIDATE_NONE):
        return ()
    if VALIDATE_ALL in words:
        return VALIDATION_CHECKS
    unknown = sorted(words - set(VALIDATION_CHECKS))
    if unknown:
        raise ValueError(
            f"unknown check(s) {', '.join(unknown)}; expected all or some of {', '.join(VALIDATION_CHECKS)}"
        )
    return tuple(c for c in VALIDATION_CHECKS if c in words)


# A job's own options: each input object may override its environment's settings with S3 object
# metadata `sluice-<option>` (`x-amz-meta-sluice-mode: batch`), read by Plan
# (`sluice.plan.plan.JobOptions.from_metadata`) and written by `sluice submit` and `sluice retry`.
METADATA_PREFIX = "sluice-"
JOB_OPTIONS = (
    "mode",
    "budget-usd",
    "model",
    "concurrency",
    "map-concurrency",
    "max-attempts",
    "on-batch-incomplete",
    "deadline-hours",
    # the time the job must end by (issue 44): a duration from the upload (`6h`) or an ISO-8601 time
    # with its zone; Plan picks batch, flex or direct per shard to hold it (`sluice.plan.deadline`)
    "deadline",
    # what the job expects a batch to take (a duration), instead of what Sluice measured or assumes
    "batch-turnaround",
    # models the job says take OpenAI's flex tier, besides those Sluice knows (names separated by commas)
    "flex-models",
    # how long a cancelled batch is given to hand back its answers (a duration), instead of the
    # environment's `batch_cancel_s`: the margin the deadline's cutover keeps for it
    "batch-cancel",
    "max-error-rate",
    "rpm",
    "tpm",
    "cache",
    "cache-incomplete",
    # the provider family the job's lines are written for: the environment's, or Plan refuses it
    "provider",
    # per-line output validation (issue 33): the checks, how many times an answer is sent in all,
    # and whether a resend carries what was wrong (`yes`/`no`)
    "validate",
    "validate-attempts",
    "validate-repair",
    # the JSON schema every answer must match: a `.json` object under `inbox/` in the job's bucket
    "validate-schema",
    # the job a retry took its lines from (`sluice retry`)
    "parent-job",
)


def job_option_key(name: str) -> str:
    """A job option's metadata key, from its name or its Python spelling (`budget_usd`)."""
    option = name.replace("_", "-")
    if option not in JOB_OPTIONS:
        raise KeyError(f"no job option {name!r}; the options are {', '.join(JOB_OPTIONS)}")
    return METADATA_PREFIX + option


class JobStatus:
    """A job's state, the one word the job row, summary, event, CLI and report all use: PLANNING
    and RUNNING while it works, then how it ended (`TERMINAL_STATUSES`)."""

    # Plan took the job and reads its input ...
    PLANNING = "PLANNING"
    # ... its shards are written and run
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    # every line is accounted for, but more failed than the job's max error rate allows
    COMPLETED_WITH_ERRORS = "COMPLETED_WITH_ERRORS"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    # the job's spending cap stopped it: the lines it did not send are errors `budget_exceeded`
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"


TERMINAL_STATUSES = frozenset(
    {
        JobStatus.SUCCEEDED,
        JobStatus.COMPLETED_WITH_ERRORS,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
        JobStatus.BUDGET_EXCEEDED,
    }
)


class ShardStatus:
    """A shard row's state: PENDING until its first checkpoint, DONE once every line has its outcome."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    DONE = "DONE"


class ExecutionStatus:
    """Step Functions' own words for an execution (DescribeExecution's `status`), not the job's."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    # stopped: a cancelled job's execution ends so
    ABORTED = "ABORTED"
