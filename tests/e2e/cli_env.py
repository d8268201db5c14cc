"""What the e2e tests share: `sluice` run as a subprocess (`sluice`, `clean_env`), its HTML report
read as a browser would (`parse_html`), and a deployed environment (`Deployed`): moto in server
mode (a real HTTP endpoint, as AWS would be) holding the resources a deployed stack has, found
through a CloudFormation stack `Sluice-dev` with the same outputs, and the core (plan, shards,
merge) run in this process against it as the deployed Lambdas would. tests/e2e/conftest.py lays it
out for each test (`deployed`)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import boto3
import orjson

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
BUCKET = "sluice-dev-bucket"
TABLE = "sluice-dev-jobs"


def sluice(*args: str, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice_local.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything AWS, so the user's real setup never leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and not k.startswith("OPENAI_")}
    env.update(extra)
    return env


@dataclass
class Deployed:
    endpoint: str
    sim: Any
    secret_arn: str
    state_machine_arn: str
    env: dict[str, str]

    @property
    def s3(self) -> Any:
        return boto3.client("s3", region_name=REGION)

    @property
    def sfn(self) -> Any:
        return boto3.client("stepfunctions", region_name=REGION)

    @property
    def table(self) -> Any:
        return boto3.resource("dynamodb", region_name=REGION).Table(TABLE)

    @property
    def store(self) -> Any:
        from sluice.store.jobs import JobStore

        return JobStore(self.table, ttl_days=7)

    def settings(self, **changes: Any) -> Any:
        from sluice.contract import Settings

        options = {
            "shard_lines": 10,
            "concurrency": 20,
            "map_concurrency": 4,
            "request_timeout_s": 5.0,
            "poll_seconds": 1,
            **changes,
        }
        return Settings(
            bucket=BUCKET,
            table=TABLE,
            provider_base_url=self.sim.base_url,
            api_key_secret_arn=self.secret_arn,
            **options,
        )

    def cli(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return sluice(*args, "--env", "dev", env=self.env, timeout=timeout)

    # -- the pipeline, as the deployed Lambdas run it

    def start(self, key: str, **settings: Any) -> dict[str, Any]:
        """What the EventBridge rule and Plan do for a new object: an execution and a plan."""
        from sluice.plan.plan import plan_job

        etag = self.s3.head_object(Bucket=BUCKET, Key=key)["ETag"].strip('"')
        event = {
            "detail-type": "Object Created",
            "detail": {"bucket": {"name": BUCKET}, "object": {"key": key, "etag": etag}},
        }
        execution = self.sfn.start_execution(stateMachineArn=self.state_machine_arn, input=json.dumps(event))[
            "executionArn"
        ]
        return plan_job(
            s3=self.s3,
            store=self.store,
            settings=self.settings(**settings),
            bucket=BUCKET,
            key=key,
            etag=etag,
            execution=execution,
        ).to_dict()

    def specs(self, state: dict[str, Any]) -> list[Any]:
        from sluice.merge.merge import load_manifest

        return load_manifest(self.s3, BUCKET, state["manifest_key"])

    def context(self, **settings: Any) -> Any:
        from sluice.send.engine import make_session
        from sluice.shard.frame import ShardContext

        return ShardContext(
            s3=self.s3,
            store=self.store,
            settings=self.settings(**settings),
            api_key="sk-test",
            remaining_s=lambda: 900.0,
            session_factory=make_session,
        )

    def run_shard(self, spec: Any) -> None:
        from sluice.runners.direct import run_direct

        assert asyncio.run(run_direct(self.context(), spec)).done

    def merge(self, state: dict[str, Any]) -> dict[str, Any]:
        from sluice.contract import Planned
        from sluice.merge.merge import merge_job

        return merge_job(s3=self.s3, store=self.store, state=Planned.from_dict(state)).to_json()

    def run_pipeline(self, key: str, **settings: Any) -> dict[str, Any]:
        """What the deployed workflow does for an uploaded object: plan, every shard, merge."""
        state = self.start(key, **settings)
        for spec in self.specs(state):
            self.run_shard(spec)
        return self.merge(state)


def errors_of(deployed: Deployed, key: str) -> list[dict[str, Any]]:
    return [orjson.loads(e) for e in deployed.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().splitlines()]


class Tags(HTMLParser):
    """Every start tag with its attributes, to count bars the way a browser would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def count(self, tag: str, css: str) -> int:
        return sum(1 for t, a in self.tags if t == tag and css in (a.get("class") or "").split())


def parse_html(path: Path) -> Tags:
    tags = Tags()
    tags.feed(path.read_text(encoding="utf-8"))
    return tags
