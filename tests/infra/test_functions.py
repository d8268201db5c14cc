from __future__ import annotations

from sluice.contract import (
    ENVIRONMENT_VARIABLE,
    FULL_VCPU_MB,
    READS,
    SETTING_DEFAULTS,
    Provider,
    ProviderKey,
    Settings,
    WebhookSettings,
    variables_read,
)
from sluice.contract.definition import FUNCTION_PLACEHOLDERS

from tests.infra.conftest import Synthesis
from tests.infra.helpers.functions import our_functions, secret_id, step_functions, webhook_function

# The seven of the original design plus the ones the definition has grown since.
HANDLERS = {step: f"sluice_handlers.{step}.handler" for step in FUNCTION_PLACEHOLDERS}
SHORT_STEPS = ("notify", "await_shard", "take_slot", "give_back_slot")
CONFIGURED = {
    "SLUICE_BUCKET",
    "SLUICE_TABLE",
    "SLUICE_PROVIDER_BASE_URL",
    "SLUICE_API_KEY_SECRET_ARN",
    "SLUICE_DEFAULT_MODE",
    "SLUICE_CONCURRENCY",
    "SLUICE_MAP_CONCURRENCY",
    "SLUICE_MAX_SHARDS_IN_FLIGHT",
    "SLUICE_MAX_ATTEMPTS",
    "SLUICE_REQUEST_TIMEOUT_S",
    "SLUICE_SHARD_LINES",
    "SLUICE_TTL_DAYS",
    "SLUICE_EVENT_BUS",
    "SLUICE_MAX_ERROR_RATE",
    "SLUICE_BUDGET_USD",
    "SLUICE_POLL_SECONDS",
    "SLUICE_SAFETY_MARGIN_S",
    "SLUICE_BATCH_QUEUE_TOKENS",
    "SLUICE_BATCH_QUEUE_DEFAULT_TOKENS",
    "SLUICE_VALIDATE",
    "SLUICE_VALIDATE_ATTEMPTS",
    "SLUICE_VALIDATE_REPAIR",
}


def test_python_312_functions_one_per_step(synthesis: Synthesis, env: str) -> None:
    functions = step_functions(synthesis, env)
    assert {step: f["Properties"]["Handler"] for step, f in functions.items()} == HANDLERS
    assert {"plan", "run_shard", "submit", "collect", "merge", "notify", "mark_failed"} <= set(functions)
    for function in functions.values():
        props = function["Properties"]
        assert props["Runtime"] == "python3.12"
        assert props["Architectures"] == ["x86_64"]
        assert "LoggingConfig" in props and "LogGroup" in props["LoggingConfig"]
    assert set(our_functions(synthesis, env)) == {*HANDLERS, "webhook"}
    codes = {str(f["Properties"]["Code"]) for f in our_functions(synthesis, env).values()}
    assert len(codes) == 1, "all steps and the webhook receiver share one code asset"


def test_sizes_and_timeouts(synthesis: Synthesis, env: str) -> None:
    functions = step_functions(synthesis, env)
    for step, function in functions.items():
        props = function["Properties"]
        assert props["Timeout"] == (30 if step in SHORT_STEPS else 900), step
        # shards get a full vCPU; Plan holds every custom_id of the input (docs/capacity.md)
        expected = {"run_shard": FULL_VCPU_MB, "plan": 3008}.get(step, 1024)
        assert props["MemorySize"] == expected, step


# what every function is given besides its settings: Powertools', the environment's name, boto3's retries
NOT_SETTINGS = {
    "POWERTOOLS_SERVICE_NAME",
    "POWERTOOLS_LOG_LEVEL",
    "POWERTOOLS_METRICS_NAMESPACE",
    "POWERTOOLS_TRACER_CAPTURE_RESPONSE",
    ENVIRONMENT_VARIABLE,
    "AWS_RETRY_MODE",
    "AWS_MAX_ATTEMPTS",
}
# a setting whose default is None is left out where it is not set (a model, a cache directory, ...)
UNSET_OPTIONAL = {Settings.variable(name) for name, default in SETTING_DEFAULTS.items() if default is None}


def _settings_variables(function: dict) -> dict[str, object]:
    variables = function["Properties"]["Environment"]["Variables"]
    return {k: v for k, v in variables.items() if k not in NOT_SETTINGS}


def _as_read(variables: dict[str, object]) -> dict[str, str]:
    """The resources' names and ARNs are tokens until deploy: a stand-in text for each."""
    return {k: v if isinstance(v, str) else f"<{k}>" for k, v in variables.items()}


def test_each_function_is_given_exactly_the_settings_its_step_reads(synthesis: Synthesis, env: str) -> None:
    """`sluice.contract.step_settings` declares each step's settings sets; infra gives its function
    their variables and nothing else, so a step never sees another's settings."""
    for step, function in step_functions(synthesis, env).items():
        variables = function["Properties"]["Environment"]["Variables"]
        assert variables.keys() >= NOT_SETTINGS, step
        ours = _settings_variables(function)
        declared = variables_read(step)
        assert ours.keys() <= declared, (step, sorted(ours.keys() - declared))
        assert declared - ours.keys() <= UNSET_OPTIONAL, (step, sorted(declared - ours.keys()))
        # read back as the step reads them: every variable parses, and none is left over
        assert Settings.reading(READS[step], _as_read(ours)).to_env().keys() == ours.keys(), step
    assert variables_read("take_slot") == {"SLUICE_TABLE", "SLUICE_TTL_DAYS", "SLUICE_MAX_SHARDS_IN_FLIGHT"}
    assert "SLUICE_API_KEY_SECRET_ARN" not in variables_read("plan") | variables_read("merge")


def test_environment_is_the_settings_the_steps_read(synthesis: Synthesis, env: str) -> None:
    config = synthesis.stacks[env].config
    given: dict[str, object] = {}
    for step, function in step_functions(synthesis, env).items():
        for name, value in _settings_variables(function).items():
            # a variable two functions are given has the same value in both
            assert given.setdefault(name, value) == value, (step, name)
    assert given.keys() >= CONFIGURED, CONFIGURED - given.keys()
    settings = Settings.from_env(_as_read(given))
    assert settings.to_env().keys() == given.keys(), "a variable the steps never read is a typo"
    assert (settings.default_model, settings.default_mode) == (config.default_model, config.default_mode)
    assert (settings.concurrency, settings.map_concurrency, settings.max_attempts) == (
        config.concurrency,
        config.map_concurrency,
        config.max_attempts,
    )
    assert settings.max_shards_in_flight == config.max_shards_in_flight
    assert (settings.request_timeout_s, settings.shard_lines, settings.ttl_days, settings.poll_seconds) == (
        config.request_timeout_s,
        config.shard_lines,
        config.ttl_days,
        config.poll_seconds,
    )
    assert (settings.safety_margin_s, settings.max_error_rate) == (config.safety_margin_s, config.max_error_rate)
    assert settings.provider_base_url == config.provider_base_url
    assert (settings.validate_attempts, settings.validate_repair) == (
        config.validate_attempts,
        config.validate_repair,
    )
    assert {model: settings.batch_queue_limit(model) for model in config.batch_queue_tokens} == dict(
        config.batch_queue_tokens
    )
    assert settings.batch_queue_limit("a-model-not-named") == config.batch_queue_default_tokens
    for step, function in step_functions(synthesis, env).items():
        variables = function["Properties"]["Environment"]["Variables"]
        assert variables["POWERTOOLS_SERVICE_NAME"] == "sluice"
        assert variables["POWERTOOLS_LOG_LEVEL"] == config.log_level
        assert variables["POWERTOOLS_METRICS_NAMESPACE"] == "Sluice"
        assert variables["SLUICE_ENV"] == env
        if ProviderKey in READS[step]:
            assert variables["SLUICE_API_KEY_SECRET_ARN"] == {"Ref": secret_id(synthesis, env, "provider-api-key")}
        else:
            assert "SLUICE_API_KEY_SECRET_ARN" not in variables, step
        assert "SLUICE_WEBHOOK_SECRET_ARN" not in variables


def test_the_environments_default_model_reaches_the_steps_that_read_it(synthesis: Synthesis, env: str) -> None:
    """cdk.json names a default model for each environment; Plan, the shard steps and Merge read it."""
    config = synthesis.stacks[env].config
    assert config.default_model
    readers = {step for step, sets in READS.items() if Provider in sets}
    assert {"plan", "run_shard", "submit_batch", "merge"} <= readers
    for step, function in step_functions(synthesis, env).items():
        model = function["Properties"]["Environment"]["Variables"].get("SLUICE_DEFAULT_MODEL")
        assert model == (config.default_model if step in readers else None), step


def test_webhook_function_reads_only_what_its_handler_needs(synthesis: Synthesis, env: str) -> None:
    props = webhook_function(synthesis, env)["Properties"]
    config = synthesis.stacks[env].config
    assert props["Runtime"] == "python3.12"
    assert props["Timeout"] <= 15 and props["MemorySize"] >= 256
    assert props["Environment"]["Variables"] == {
        "SLUICE_TABLE": {"Ref": next(iter(synthesis.resources(env, "AWS::DynamoDB::Table")))},
        "SLUICE_WEBHOOK_SECRET_ARN": {"Ref": secret_id(synthesis, env, "webhook-signing-secret")},
        "SLUICE_TTL_DAYS": str(config.ttl_days),
        "SLUICE_ENV": env,
        "POWERTOOLS_SERVICE_NAME": "sluice",
        "POWERTOOLS_LOG_LEVEL": config.log_level,
        "POWERTOOLS_METRICS_NAMESPACE": "Sluice",
        "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
        "AWS_RETRY_MODE": "standard",
        "AWS_MAX_ATTEMPTS": "5",
    }
    read = WebhookSettings.from_env(
        {k: v if isinstance(v, str) else f"<{k}>" for k, v in props["Environment"]["Variables"].items()}
    )
    assert read.ttl_days == config.ttl_days


def test_function_log_groups_have_retention(synthesis: Synthesis, env: str) -> None:
    groups = synthesis.resources(env, "AWS::Logs::LogGroup")
    expected = synthesis.stacks[env].config.log_retention_days
    for function in our_functions(synthesis, env).values():
        logical_id = function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        assert groups[logical_id]["Properties"]["RetentionInDays"] == expected


def test_every_function_is_traced_and_retries_aws_calls_in_standard_mode(synthesis: Synthesis, env: str) -> None:
    for handler, function in our_functions(synthesis, env).items():
        props = function["Properties"]
        assert props["TracingConfig"] == {"Mode": "Active"}, handler
        variables = props["Environment"]["Variables"]
        assert variables["AWS_RETRY_MODE"] == "standard", handler
        assert int(variables["AWS_MAX_ATTEMPTS"]) >= 3, handler
        assert variables["POWERTOOLS_TRACER_CAPTURE_RESPONSE"] == "false", handler
        assert "POWERTOOLS_TRACE_DISABLED" not in variables, handler


def test_every_lambda_in_the_stack_logs_to_a_group_that_expires(synthesis: Synthesis, env: str) -> None:
    """CDK's own Lambdas too (bucket notifications, the auto-delete provider): else Lambda creates
    /aws/lambda/<name> on their first run, kept forever."""
    groups = synthesis.resources(env, "AWS::Logs::LogGroup")
    expected = synthesis.stacks[env].config.log_retention_days
    functions = synthesis.resources(env, "AWS::Lambda::Function")
    theirs = [k for k, f in functions.items() if not f["Properties"].get("Handler", "").startswith("sluice_handlers.")]
    assert theirs, "CDK adds at least the bucket notifications handler"
    for logical_id, function in functions.items():
        group = function["Properties"].get("LoggingConfig", {}).get("LogGroup", {}).get("Ref")
        assert group in groups, logical_id
        assert groups[group]["Properties"]["RetentionInDays"] == expected, logical_id


def test_only_the_webhook_reserves_concurrency_and_the_shards_fit_the_account_beside_it(
    synthesis: Synthesis, env: str
) -> None:
    from infra.config import UNRESERVED_CONCURRENCY

    config = synthesis.stacks[env].config
    reserved = {
        name: f["Properties"].get("ReservedConcurrentExecutions") for name, f in our_functions(synthesis, env).items()
    }
    # a shard runs one of its five steps at a time: a reservation each held five places a shard
    assert {name for name, n in reserved.items() if n is not None} == {"webhook"}
    total = sum(n for n in reserved.values() if n is not None)
    assert total == reserved["webhook"] == config.webhook_concurrency == config.reserved_concurrency >= 10
    assert config.map_concurrency <= config.max_shards_in_flight
    # one job's shards in flight fit beside the reservation and the 100 Lambda keeps unreserved
    assert config.max_shards_in_flight + total <= config.account_concurrency - UNRESERVED_CONCURRENCY
    assert config.account_concurrency == 1000
