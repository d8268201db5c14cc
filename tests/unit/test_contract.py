"""The contract: settings read back as written, and a workflow state with no unknown keys."""

from __future__ import annotations

from typing import Any

import pytest
from sluice.contract import (
    STEPS,
    Collected,
    DirectRun,
    Settings,
    SettingsError,
    ShardSpec,
    StateError,
    Submitted,
    WebhookSettings,
    manifest_key,
)
from sluice.contract.model import Request
from sluice.formats.lines import parse_line

REQUIRED: dict[str, Any] = {"bucket": "b", "table": "t", "provider_base_url": "http://p", "api_key_secret_arn": "arn:s"}


def test_settings_survive_the_environment_both_ways() -> None:
    chosen = Settings(
        **REQUIRED,
        default_model="gpt-4o-mini",
        default_mode="auto",
        concurrency=7,
        request_timeout_s=2.5,
        rpm=600,
        on_batch_incomplete="error",
        max_error_rate=0.01,
        budget_usd=12.5,
    )
    assert Settings.from_env(chosen.to_env()) == chosen
    assert Settings.from_env(Settings(**REQUIRED).to_env()) == Settings(**REQUIRED)
    assert "SLUICE_DEFAULT_MODEL" not in Settings(**REQUIRED).to_env()
    webhook = WebhookSettings(table="t", webhook_secret_arn="arn:w", ttl_days=3)
    assert WebhookSettings.from_env(webhook.to_env()) == webhook


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SLUICE_BUCKET", "", "missing required setting SLUICE_BUCKET"),
        ("SLUICE_DEFAULT_MODE", "fast", "SLUICE_DEFAULT_MODE='fast'; expected one of direct, background, batch, auto"),
        ("SLUICE_CONCURRENCY", "0", "SLUICE_CONCURRENCY must be positive, got 0"),
        ("SLUICE_REQUEST_TIMEOUT_S", "soon", "SLUICE_REQUEST_TIMEOUT_S='soon' is not a float"),
        ("SLUICE_RPM", "-1", "SLUICE_RPM='-1' is not a whole number"),
        (
            "SLUICE_BATCH_QUEUE_DEFAULT_TOKENS",
            "lots",
            "SLUICE_BATCH_QUEUE_DEFAULT_TOKENS='lots' is not a whole number (0 means no limit)",
        ),
        ("SLUICE_MAX_ERROR_RATE", "2", "SLUICE_MAX_ERROR_RATE='2'"),
        ("SLUICE_ON_BATCH_INCOMPLETE", "drop", "expected one of direct, error"),
        ("SLUICE_PROVIDER", "mistral", "SLUICE_PROVIDER='mistral'; expected one of openai, anthropic, bedrock"),
        (
            "SLUICE_BUDGET_USD",
            "-5",
            "SLUICE_BUDGET_USD='-5' is not an amount of US dollars up to 1,000,000,000 (0 means no budget)",
        ),
        ("SLUICE_BUDGET_USD", "1e30", "SLUICE_BUDGET_USD='1e30' is not an amount of US dollars up to"),
        ("SLUICE_BUDGET_USD", "nan", "SLUICE_BUDGET_USD='nan' is not an amount of US dollars"),
        ("SLUICE_RATE_LIMITS", '{"gpt-4o-mini": 500}', 'SLUICE_RATE_LIMITS: gpt-4o-mini: expected {"rpm"'),
        ("SLUICE_RATE_LIMITS", "rpm=500", "SLUICE_RATE_LIMITS: expected a JSON object of models"),
    ],
)
def test_a_bad_variable_is_named(variable: str, value: str, message: str) -> None:
    env = {**Settings(**REQUIRED).to_env(), variable: value}
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env(env)


def test_every_step_has_its_handler_module() -> None:
    import importlib

    for step in STEPS.values():
        assert callable(importlib.import_module(step.module).handler), step.name
    assert STEPS["run_shard"].placeholder == "RunShardFunctionArn"
    assert manifest_key("j-1") == "jobs/j-1/manifest.json"


def test_the_default_model_fills_in_only_a_line_that_names_none() -> None:
    def model(raw: bytes, **kw: str) -> str:
        parsed = parse_line(raw, 1, **kw)  # type: ignore[arg-type]
        assert isinstance(parsed, Request) and parsed.body is not None
        import orjson

        return str(orjson.loads(parsed.body)["model"])

    unnamed = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}'
    named = unnamed.replace(b'{"messages"', b'{"model": "gpt-4o", "messages"')
    assert model(unnamed, default_model="gpt-4o-mini") == "gpt-4o-mini"
    assert model(named, default_model="gpt-4o-mini") == "gpt-4o"
    # the job's own `sluice-model` replaces every line's, the default included
    assert model(unnamed, model="o3", default_model="gpt-4o-mini") == "o3"
    assert model(named, model="o3", default_model="gpt-4o-mini") == "o3"


MANIFEST_ITEM = {
    "job_id": "j-1",
    "shard": 3,
    "bucket": "b",
    "key": "inbox/x.jsonl",
    "etag": '"e"',
    "start": 0,
    "end": 100,
    "first_line": 1,
    "lines": 10,
    "mode": "background",
    "on_batch_incomplete": "direct",
    "concurrency": 5,
    "rpm": 0,
    "tpm": 0,
    "max_attempts": 6,
    "model": None,
    "default_model": None,
    "duplicates_key": None,
    "blank": 0,
}


def test_a_shard_reads_its_state_and_keeps_when_it_first_waited() -> None:
    from sluice_handlers.shard_state import shard_spec_from_state

    submitted = Submitted(submitted=True, run=1, wait_seconds=10, waiting_since=1234.5)
    spec = shard_spec_from_state({"shard": MANIFEST_ITEM, "submit": submitted.to_dict()})
    assert (spec.job_id, spec.shard, spec.concurrency, spec.waiting_since) == ("j-1", 3, 5, 1234.5)
    assert shard_spec_from_state({"shard": MANIFEST_ITEM}).waiting_since is None


@pytest.mark.parametrize(
    ("state", "named"),
    [
        # a typo in the shard no longer becomes the field's default
        ({"shard": {**MANIFEST_ITEM, "concurency": 50}}, "concurency"),
        ({"shard": {k: v for k, v in MANIFEST_ITEM.items() if k != "lines"}}, "lines"),
        # a step's result the definition does not know of
        ({"shard": MANIFEST_ITEM, "done": True}, "done"),
        ({"shard": MANIFEST_ITEM, "collect": {"done": True, "waiting": 0, "wait_s": 1}}, "wait_s"),
    ],
)
def test_an_unknown_or_missing_key_in_a_shards_state_is_an_error(state: dict[str, Any], named: str) -> None:
    from sluice_handlers.shard_state import shard_spec_from_state

    with pytest.raises(StateError, match=named):
        shard_spec_from_state(state)


@pytest.mark.parametrize("unknown", ["concurency", "priority"])
def test_a_manifest_item_with_an_unknown_key_is_refused_by_name(unknown: str) -> None:
    from sluice.shard.frame import ShardSpec

    # Merge and `sluice results` read the manifest with it: a typo is an error, not a default
    with pytest.raises(StateError, match=unknown):
        ShardSpec.from_dict({**MANIFEST_ITEM, unknown: 50})


def test_a_step_result_is_exactly_its_fields() -> None:
    assert DirectRun.from_dict({"done": False, "run": 2, "sent": 7}) == DirectRun(done=False, run=2, sent=7)
    with pytest.raises(StateError, match="finished"):
        DirectRun.from_dict({"done": True, "run": 2, "sent": 7, "finished": True})
    with pytest.raises(KeyError):
        Collected.path("finished")
    assert Collected.path("wait_seconds") == "$.collect.wait_seconds"
    with pytest.raises(KeyError):
        ShardSpec.path("kind")
    assert ShardSpec.path("mode") == "$.shard.mode"
    assert Collected.selector() == {
        "done.$": "$.Payload.done",
        "waiting.$": "$.Payload.waiting",
        "wait_seconds.$": "$.Payload.wait_seconds",
    }


def test_the_definition_names_the_state_only_through_the_steps_results() -> None:
    from sluice.contract import SHARD_KEY, BatchCollected, BatchSubmitted, MarkedFailed, Merged, Planned, SlotTaken
    from sluice.contract.definition import definition

    steps = (Planned, SlotTaken, DirectRun, Submitted, Collected, BatchSubmitted, BatchCollected, Merged, MarkedFailed)
    results = {r.KEY: r for r in steps}

    def resolves(path: str) -> bool:
        key, _, name = path.removeprefix("$.").partition(".")
        if key == SHARD_KEY:
            return ShardSpec.path(name) == path
        return key in results and results[key].path(name) == path

    (shards,) = [s for s in definition()["States"].values() if s["Type"] == "Map"]
    states = {**definition()["States"], **shards["ItemProcessor"]["States"]}
    invoked = set()
    for name, state in states.items():
        for choice in state.get("Choices", []):
            assert resolves(choice["Variable"]), (name, choice)
        for field in ("TimeoutSecondsPath", "SecondsPath"):
            if field in state:
                assert resolves(state[field]), name
        if state.get("Resource") == "arn:aws:states:::lambda:invoke":
            # a step's answer never replaces the state: it lands under its own key, or nowhere
            assert "OutputPath" not in state or state["OutputPath"] == f"$.{Merged.KEY}", name
            if state["ResultPath"] is not None:
                result = results[state["ResultPath"].removeprefix("$.")]
                assert state["ResultSelector"] == result.selector(), name
                invoked.add(result.KEY)
    assert invoked == set(results)
    assert resolves(shards["MaxConcurrencyPath"]) and resolves(shards["ItemReader"]["Parameters"]["Key.$"])
    # a Map child ends with `true`, 5 bytes of the Map's gathered output, whatever its state holds
    assert states["Shard finished"] == {"Type": "Pass", "Result": True, "End": True}
