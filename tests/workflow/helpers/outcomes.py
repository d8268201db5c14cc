"""What test_outcomes.py and the tests beside it share."""

from __future__ import annotations

import json
from typing import Any

import boto3

from sluice_local.cloud import REGION, LocalCloud


def watch_events(cloud: LocalCloud) -> str:
    """An SQS queue that gets every event Sluice puts on the default bus, as a user's rule would."""
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(QueueName="sluice-events")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events = boto3.client("events", region_name=REGION)
    events.put_rule(Name="sluice-jobs", EventPattern=json.dumps({"source": ["sluice"]}))
    events.put_targets(Rule="sluice-jobs", Targets=[{"Id": "queue", "Arn": arn}])
    return str(url)


def received(url: str) -> list[dict[str, Any]]:
    sqs = boto3.client("sqs", region_name=REGION)
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    return [json.loads(m["Body"]) for m in messages]
