"""A deployed environment, found from its CloudFormation stack, never from hand-copied names;
and botocore's exceptions as messages a person can act on."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProfileNotFound,
    TokenRetrievalError,
)
from sluice.contract import DEFAULT_PROVIDER
from sluice.store.jobs import JobStore

from sluice_local.console import EXIT_AWS, EXIT_ENVIRONMENT, CliError, say
from sluice_local.deployed.local_jobs import LOCAL_JOB_HINT, refuse_local_job

STACK_PREFIX = "Sluice-"
# a stack whose provider signs its requests (Bedrock) holds no key, so has no ApiKeySecretArn
REQUIRED_OUTPUTS = ("BucketName", "TableName", "StateMachineArn")
_CREDENTIAL_CODES = frozenset(
    {
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AuthFailure",
    }
)


@contextlib.contextmanager
def aws_errors() -> Iterator[None]:
    """botocore's exceptions, turned into one line a person can act on and an exit code."""
    try:
        yield
    except (NoCredentialsError, PartialCredentialsError) as exc:
        raise CliError(
            f"no AWS credentials ({exc}): set AWS_PROFILE, run `aws configure` or `aws sso login`, "
            "or export AWS_ACCESS_KEY_ID",
            EXIT_AWS,
        ) from exc
    except TokenRetrievalError as exc:
        raise CliError(f"AWS SSO session expired: run `aws sso login` ({exc})", EXIT_AWS) from exc
    except NoRegionError as exc:
        raise CliError("no AWS region: pass --region or set AWS_DEFAULT_REGION", EXIT_AWS) from exc
    except ProfileNotFound as exc:
        raise CliError(f"{exc}: check --profile / AWS_PROFILE", EXIT_AWS) from exc
    except EndpointConnectionError as exc:
        raise CliError(f"cannot reach AWS: {exc}", EXIT_AWS) from exc
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = str(error.get("Code", "")), str(error.get("Message", ""))
        if code in _CREDENTIAL_CODES:
            text = f"AWS rejected the credentials ({code}): {message}"
        elif "AccessDenied" in code or code == "403":
            text = f"access denied for {exc.operation_name}: {message or code} (check your identity's IAM permissions)"
        else:
            text = f"AWS error in {exc.operation_name}: {code}: {message}"
        raise CliError(text, EXIT_AWS) from exc


def error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


@dataclass
class Deployment:
    """One environment, as its stack's outputs describe it."""

    env: str
    stack: str
    region: str
    outputs: dict[str, str]
    session: Any

    @property
    def bucket(self) -> str:
        return self.outputs["BucketName"]

    @property
    def table_name(self) -> str:
        return self.outputs["TableName"]

    @property
    def state_machine_arn(self) -> str:
        return self.outputs["StateMachineArn"]

    @property
    def provider(self) -> str:
        """The provider family the environment sends to; a stack from before it said one is OpenAI's."""
        return self.outputs.get("Provider") or DEFAULT_PROVIDER

    def client(self, service: str) -> Any:
        return self.session.client(service)

    @functools.cached_property
    def s3(self) -> Any:
        return self.client("s3")

    @functools.cached_property
    def sfn(self) -> Any:
        return self.client("stepfunctions")

    @functools.cached_property
    def store(self) -> JobStore:
        table = self.session.resource("dynamodb").Table(self.table_name)
        # the CLI writes no new rows, so the TTL it would stamp never matters
        return JobStore(table, ttl_days=14)

    def api_key(self) -> str:
        arn = self.outputs.get("ApiKeySecretArn")
        if not arn:
            raise CliError(
                f"{self.stack} holds no provider API key: its {self.provider} provider has none", EXIT_ENVIRONMENT
            )
        value = self.client("secretsmanager").get_secret_value(SecretId=arn)
        secret = value.get("SecretString") or ""
        if not secret:
            raise CliError(f"the provider API key secret of {self.stack} is empty", EXIT_ENVIRONMENT)
        return str(secret)

    def provider_base_url(self) -> str:
        """What the stack's Lambda functions are configured with: the stack has no output for it."""
        cfn, lam = self.client("cloudformation"), self.client("lambda")
        for page in cfn.get_paginator("list_stack_resources").paginate(StackName=self.stack):
            for resource in page["StackResourceSummaries"]:
                if resource["ResourceType"] != "AWS::Lambda::Function":
                    continue
                config = lam.get_function_configuration(FunctionName=resource["PhysicalResourceId"])
                url = (config.get("Environment") or {}).get("Variables", {}).get("SLUICE_PROVIDER_BASE_URL")
                if url:
                    return str(url)
        raise CliError(
            f"cannot tell which provider {self.stack} uses: none of its functions names one",
            EXIT_ENVIRONMENT,
        )


def connect(env: str, *, region: str | None = None, profile: str | None = None) -> Deployment:
    session = boto3.Session(profile_name=profile, region_name=region)
    if not session.region_name:
        raise CliError("no AWS region: pass --region or set AWS_DEFAULT_REGION", EXIT_AWS)
    cfn = session.client("cloudformation")
    stack = STACK_PREFIX + env
    try:
        found = cfn.describe_stacks(StackName=stack)["Stacks"][0]
    except ClientError as exc:
        if error_code(exc) == "ValidationError" and "does not exist" in str(exc):
            known = _environments(cfn)
            hint = f"deployed here: {', '.join(known)}" if known else "no Sluice environment is deployed here"
            raise CliError(
                f"unknown environment {env!r}: no stack {stack} in {session.region_name} ({hint}; "
                f"deploy with `cdk deploy -c env={env}`)",
                EXIT_ENVIRONMENT,
            ) from exc
        raise
    outputs = {o["OutputKey"]: o["OutputValue"] for o in found.get("Outputs", [])}
    missing = [name for name in REQUIRED_OUTPUTS if not outputs.get(name)]
    if missing:
        raise CliError(
            f"stack {stack} ({found.get('StackStatus')}) lacks output(s) {', '.join(missing)}: "
            "is the deployment complete?",
            EXIT_ENVIRONMENT,
        )
    return Deployment(env=env, stack=stack, region=str(session.region_name), outputs=outputs, session=session)


def _environments(cfn: Any) -> list[str]:
    names: list[str] = []
    with contextlib.suppress(Exception):
        for page in cfn.get_paginator("describe_stacks").paginate():
            names.extend(
                s["StackName"].removeprefix(STACK_PREFIX)
                for s in page["Stacks"]
                if s["StackName"].startswith(STACK_PREFIX)
            )
    return sorted(names)


def environment(env: str, *, region: str | None, profile: str | None, job_id: str | None = None) -> Deployment:
    """The environment a command names, announced on stderr; a local job's id is refused first,
    and an AWS failure with a job id hints that the id may be a local one."""
    refuse_local_job(job_id)
    try:
        with aws_errors():
            dep = connect(env, region=region, profile=profile)
    except CliError as exc:
        if job_id and exc.code == EXIT_AWS:
            raise CliError(f"{exc}\n(and if {job_id} came from `sluice run`: {LOCAL_JOB_HINT})", exc.code) from exc
        raise
    say(f"environment {dep.env}: stack {dep.stack} in {dep.region}")
    return dep
