from __future__ import annotations

import copy

import aws_cdk as cdk
import pytest

from infra.config import Environment
from infra.config_values import ConfigError
from infra.stack import build_app
from tests.infra.conftest import CONTEXT
from tests.infra.helpers.config import ENVIRONMENTS, with_value


def test_cdk_json_environments_are_valid() -> None:
    for name in ENVIRONMENTS:
        config = Environment.from_context(name, ENVIRONMENTS)
        assert config.stack_name == f"Sluice-{name}"
    assert Environment.from_context("dev", ENVIRONMENTS).map_concurrency == 10
    assert Environment.from_context("prod", ENVIRONMENTS).map_concurrency == 40


def test_batch_queue_limits_default_to_openais_tier_1_figures() -> None:
    dev = Environment.from_context("dev", ENVIRONMENTS)
    assert dev.batch_queue_tokens["gpt-4o-mini"] == 2_000_000 and dev.batch_queue_tokens["gpt-4o"] == 90_000
    assert dev.batch_queue_default_tokens == 90_000
    unset = copy.deepcopy(ENVIRONMENTS)
    del unset["dev"]["batch_queue_tokens"], unset["dev"]["batch_queue_default_tokens"]
    assert Environment.from_context("dev", unset).batch_queue_tokens == dev.batch_queue_tokens
    mine = Environment.from_context("dev", with_value("dev", "batch_queue_tokens", {"my-model": 0}))
    assert mine.batch_queue_tokens == {"my-model": 0}


def test_unknown_environment_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown environment 'staging'.*dev, gemini, prod"):
        Environment.from_context("staging", ENVIRONMENTS)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("concurrency", -1, r"environment 'dev': concurrency must be a positive integer, got -1"),
        ("concurrency", True, r"concurrency must be a positive integer"),
        ("map_concurrency", "10", r"map_concurrency must be a positive integer"),
        ("max_attempts", -1, r"max_attempts must be a whole number of sends \(0 = as the job needs\)"),
        ("request_timeout_s", 0, r"request_timeout_s must be a positive number"),
        ("default_mode", "turbo", r"default_mode must be one of direct, background, batch, auto"),
        ("removal_policy", "snapshot", r"removal_policy must be one of destroy, retain"),
        ("versioning", "yes", r"versioning must be true or false"),
        ("log_level", "LOUD", r"log_level must be one of"),
        ("log_retention_days", 8, r"log_retention_days must be one of"),
        ("alarm_email", "ops", r"alarm_email must be an email address"),
        ("provider_base_url", "api.openai.com", r"provider_base_url must be an http\(s\) URL"),
        ("api_key_secret_arn", "arn:aws:s3:::bucket", r"api_key_secret_arn must be the complete ARN"),
        (
            "webhook_secret_arn",
            "arn:aws:secretsmanager:eu-west-1:123456789012:secret:whsec",
            r"webhook_secret_arn must be the complete ARN",
        ),
        ("provider_rpm", 0, r"provider_rpm must be a positive integer"),
        ("max_shards_in_flight", 2.5, r"max_shards_in_flight must be a positive integer"),
        ("account_concurrency", -1, r"account_concurrency must be a positive integer"),
        ("webhook_reserved_concurrency", -1, r"webhook_reserved_concurrency must be a whole number"),
        ("bedrock_batch_jobs_quota", 0, r"bedrock_batch_jobs_quota must be a positive integer"),
        ("table_warm_writes_per_s", 3000, r"table_warm_writes_per_s must be 0 \(a new table's\) or a whole number"),
        ("table_warm_writes_per_s", 50_000, r"table_warm_writes_per_s must be 0"),
        ("table_warm_reads_per_s", 1.5, r"table_warm_reads_per_s must be 0"),
        ("webhook_rate_limit", 100, r"webhook_rate_limit is no longer a setting: .* derived from provider_rpm"),
        ("max_error_rate", 1.5, r"max_error_rate must be a number from 0 to 1"),
        ("max_error_rate", -0.1, r"max_error_rate must be a number from 0 to 1"),
        ("max_error_rate", "0.01", r"max_error_rate must be a number from 0 to 1"),
        ("batch_queue_tokens", {"gpt-4o": -1}, r"batch_queue_tokens must map model names to whole numbers"),
        ("batch_queue_tokens", {"a,b": 5}, r"batch_queue_tokens must map model names"),
        ("batch_queue_tokens", [90000], r"batch_queue_tokens must map model names"),
        ("batch_queue_default_tokens", 1.5, r"batch_queue_default_tokens must be a whole number"),
        ("budget_usd", -1, r"budget_usd must be an amount of US dollars, 0 or null for no cap"),
        ("budget_usd", "5", r"budget_usd must be an amount of US dollars, 0 or null for no cap"),
        ("concurency", 5, r"environment 'dev': unknown key\(s\) concurency"),
        ("validate", "jsn", r"validate must be all, or names of checks"),
        ("validate", 1, r"validate must be all, or names of checks"),
        ("validate_attempts", 0, r"validate_attempts must be a positive integer"),
        ("validate_repair", "yes", r"validate_repair must be on or off"),
        ("rate_limits", {"gpt-4o-mini": {"tpm": 5}}, r"rate_limits must be an object of models"),
        ("rate_limits", {"gpt-4o-mini": {"rpm": -1}}, r"rate_limits must be an object of models"),
        ("rate_limits", ["gpt-4o-mini"], r"rate_limits must be an object of models"),
        ("prices", {"my-finetune": [0.3]}, r"prices must be an object of models \(my-finetune: expected \[input"),
        ("prices", {"my-finetune": [0.3, -1]}, r"prices must be an object of models"),
        ("prices", [0.3, 1.2], r"prices must be an object of models"),
        ("production", "yes", r"production must be true, false or null"),
        ("alarm_topic_arn", "arn:aws:sqs:eu-west-1:123456789012:ops", r"alarm_topic_arn must be the ARN of an SNS"),
    ],
)
def test_bad_values_name_the_environment_and_key(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Environment.from_context("dev", with_value("dev", key, value))


def test_missing_required_key() -> None:
    environments = copy.deepcopy(ENVIRONMENTS)
    del environments["prod"]["ttl_days"]
    with pytest.raises(ConfigError, match=r"environment 'prod': missing required key 'ttl_days'"):
        Environment.from_context("prod", environments)


def test_env_context_builds_only_that_stack() -> None:
    app = cdk.App(context={**CONTEXT, "env": "prod", "aws:cdk:bundling-stacks": []})
    stacks = build_app(app)
    assert [s.stack_name for s in stacks.values()] == ["Sluice-prod"]
    assert [c.node.id for c in app.node.children if isinstance(c, cdk.Stack)] == ["Sluice-prod"]


def test_prod_without_anyone_to_alarm_fails_the_synth_naming_the_setting() -> None:
    unheard = with_value("prod", "alarm_email", None)
    app = cdk.App(context={**CONTEXT, "environments": unheard, "env": "prod", "aws:cdk:bundling-stacks": []})
    with pytest.raises(ConfigError) as refused:
        build_app(app)
    assert str(refused.value) == (
        "environment 'prod' says \"production\": true, and its alarms would reach nobody: set alarm_email in "
        "cdk.json (context.environments.prod.alarm_email) to the address that answers them, or alarm_topic_arn "
        "(context.environments.prod.alarm_topic_arn) to an SNS topic that someone watches"
    )
    # named prod is production unless cdk.json says otherwise
    del unheard["prod"]["production"]
    with pytest.raises(ConfigError, match=r"environment 'prod' is named prod, and its alarms would reach nobody"):
        Environment.from_context("prod", unheard)
    assert Environment.from_context("prod", unheard | {"prod": {**unheard["prod"], "production": False}})
    # a topic of the operator's is someone to hear them too
    topic = "arn:aws:sns:eu-west-1:123456789012:ops-pager"
    unheard["prod"]["alarm_topic_arn"] = topic
    assert Environment.from_context("prod", unheard).alarm_topic_arn == topic
    # and any environment may say it is production
    with pytest.raises(ConfigError, match=r"environment 'dev' says \"production\": true"):
        Environment.from_context("dev", with_value("dev", "production", True))
    assert not Environment.from_context("dev", ENVIRONMENTS).in_production


def test_env_context_with_an_unknown_name_fails_clearly() -> None:
    app = cdk.App(context={**CONTEXT, "env": "qa", "aws:cdk:bundling-stacks": []})
    with pytest.raises(ConfigError, match=r"unknown environment 'qa'"):
        build_app(app)


def test_the_secrets_key_must_be_a_key_arn_for_imported_secrets() -> None:
    secret = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:sluice/openai-AbCdEf"
    key = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    environments = with_value("prod", "api_key_secret_arn", secret)
    environments["prod"]["secrets_kms_key_arn"] = key
    assert Environment.from_context("prod", environments).secrets_kms_key_arn == key
    environments["prod"]["secrets_kms_key_arn"] = "arn:aws:kms:eu-west-1:123456789012:alias/sluice"
    with pytest.raises(ConfigError, match=r"secrets_kms_key_arn must be the ARN of a KMS key"):
        Environment.from_context("prod", environments)
    with pytest.raises(ConfigError, match=r"secrets_kms_key_arn applies only to imported secrets"):
        Environment.from_context("prod", with_value("prod", "secrets_kms_key_arn", key))


def test_an_environment_budget_is_read_in_dollars_and_null_is_none() -> None:
    config = Environment.from_context("dev", with_value("dev", "budget_usd", 25))
    assert config.budget_usd == 25.0
    assert Environment.from_context("dev", with_value("dev", "budget_usd", None)).budget_usd is None


def test_rate_limits_reach_the_steps_as_the_shared_limits_seeds() -> None:
    import aws_cdk.aws_dynamodb as dynamodb
    import aws_cdk.aws_s3 as s3
    import aws_cdk.aws_secretsmanager as secretsmanager
    from sluice.contract import RateSeed, Settings, parse_rate_limits

    from infra.functions import lambda_environment

    limits = {"gpt-4o-mini": {"rpm": 30000, "tpm": 150000000}, "gpt-4o": {"rpm": 500}}
    config = Environment.from_context("dev", with_value("dev", "rate_limits", limits))
    stack = cdk.Stack(cdk.App(), "T")
    table = dynamodb.Table(stack, "Tb", partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING))
    env = lambda_environment(
        config, bucket=s3.Bucket(stack, "B"), table=table, api_key=secretsmanager.Secret(stack, "S")
    )
    assert parse_rate_limits(env["SLUICE_RATE_LIMITS"]) == {
        "gpt-4o-mini": RateSeed(30000, 150000000),
        "gpt-4o": RateSeed(500, 0),
    }
    assert parse_rate_limits(Settings.from_env(env).rate_limits) == parse_rate_limits(env["SLUICE_RATE_LIMITS"])
    # none configured: no variable, the limits are learned from the provider's headers
    plain = lambda_environment(
        Environment.from_context("dev", ENVIRONMENTS),
        bucket=s3.Bucket(stack, "B2"),
        table=table,
        api_key=secretsmanager.Secret(stack, "S2"),
    )
    assert "SLUICE_RATE_LIMITS" not in plain


def test_an_environments_prices_reach_the_steps_that_price_and_override_the_source() -> None:
    import aws_cdk.aws_dynamodb as dynamodb
    import aws_cdk.aws_s3 as s3
    import aws_cdk.aws_secretsmanager as secretsmanager
    from sluice.contract import READS, Provider
    from sluice.core import prices as price_source

    from infra.functions import lambda_environment, step_environment

    config = Environment.from_context("dev", with_value("dev", "prices", {"my-finetune": [0.3, 1.2, 0.03]}))
    stack = cdk.Stack(cdk.App(), "T")
    table = dynamodb.Table(stack, "Tb", partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING))
    env = lambda_environment(
        config, bucket=s3.Bucket(stack, "B"), table=table, api_key=secretsmanager.Secret(stack, "S")
    )
    pricing = {step for step, sets in READS.items() if Provider in sets}
    assert {"plan", "run_shard", "collect_batch", "merge", "mark_failed"} <= pricing
    for step in READS:
        given = step_environment(env, step)
        assert ("SLUICE_PRICES" in given) == (step in pricing), step
    # what a step looks up with it: the override, not the source (which has no such model)
    found = price_source.env_overrides(env["SLUICE_PRICES"])["my-finetune"]
    assert (found.standard.input, found.standard.output, found.standard.cached_input) == (0.3, 1.2, 0.03)
    assert price_source.source_prices("my-finetune") is None


def test_a_job_may_not_run_more_shards_at_once_than_the_environment_lets_run() -> None:
    with pytest.raises(ConfigError, match=r"'prod': map_concurrency \(40\) is above max_shards_in_flight \(30\)"):
        Environment.from_context("prod", with_value("prod", "max_shards_in_flight", 30))


def test_a_jobs_shards_must_fit_the_account_beside_the_webhook_and_the_unreserved_hundred() -> None:
    # 801 shards + the webhook's 100 is 901: one more than the 900 a 1,000 quota leaves
    with pytest.raises(ConfigError, match=r"needs 901 concurrent Lambdas, more than the 900"):
        Environment.from_context("prod", with_value("prod", "max_shards_in_flight", 801))
    # a thousand shards need a quota of 1,200, not the 5,200 a reservation on each of five steps did
    thousand = with_value("prod", "max_shards_in_flight", 1000)
    thousand["prod"]["account_concurrency"] = 1200
    assert Environment.from_context("prod", thousand).reserved_concurrency == 100
    thousand["prod"]["account_concurrency"] = 1199
    with pytest.raises(ConfigError, match=r"needs 1100 concurrent Lambdas, more than the 1099"):
        Environment.from_context("prod", thousand)


def test_an_environment_naming_no_cap_on_shards_in_flight_takes_half_the_account_less_its_reservation() -> None:
    unnamed = copy.deepcopy(dict(ENVIRONMENTS))
    del unnamed["prod"]["max_shards_in_flight"]
    # 1,000 / 2 - the webhook's 100: the environment's shards use at most half the account's Lambdas
    assert Environment.from_context("prod", unnamed).max_shards_in_flight == 400
    unnamed["prod"]["account_concurrency"] = 3000
    assert Environment.from_context("prod", unnamed).max_shards_in_flight == 1400
    assert Environment.from_context("prod", ENVIRONMENTS).max_shards_in_flight == 100


def test_an_account_whose_quota_cannot_hold_the_webhooks_reservation_fails_at_synth_saying_what_to_do() -> None:
    """A new account's quota may be 10: CloudFormation would create half the stack, then fail on the
    webhook function's reservation and roll back. Synth says so first, and the two ways out."""
    fresh = with_value("dev", "account_concurrency", 10)
    fresh["dev"]["max_shards_in_flight"] = fresh["dev"]["map_concurrency"] = 5
    with pytest.raises(ConfigError, match=r"'dev': the webhook function reserves 100 .* an account_concurrency of 10 "):
        Environment.from_context("dev", fresh)
    with pytest.raises(ConfigError, match=r"set webhook_reserved_concurrency to 0"):
        Environment.from_context("dev", fresh)
    # no reservation: nothing needs the unreserved hundred, and the shards fit the quota itself
    fresh["dev"]["webhook_reserved_concurrency"] = 0
    config = Environment.from_context("dev", fresh)
    assert (config.webhook_concurrency, config.reserved_concurrency) == (0, 0)
    fresh["dev"]["max_shards_in_flight"] = 11
    with pytest.raises(ConfigError, match=r"needs 11 concurrent Lambdas, more than the 10"):
        Environment.from_context("dev", fresh)


def test_an_environment_without_a_reservation_synthesizes_a_webhook_function_with_none() -> None:
    import aws_cdk as cdk
    from aws_cdk import assertions

    from infra.stack import build_app
    from tests.infra.conftest import CONTEXT

    environments = {"dev": {**CONTEXT["environments"]["dev"], "webhook_reserved_concurrency": 0}}
    app = cdk.App(context={**CONTEXT, "environments": environments, "aws:cdk:bundling-stacks": []})
    template = assertions.Template.from_stack(build_app(app, ["dev"])["dev"])
    functions = template.find_resources("AWS::Lambda::Function").values()
    assert not [f for f in functions if "ReservedConcurrentExecutions" in f["Properties"]]


def test_the_webhook_endpoint_and_function_grow_with_the_providers_rate() -> None:
    slow = Environment.from_context("dev", with_value("dev", "provider_rpm", 3000))
    assert (slow.webhook_rate_limit, slow.webhook_burst_limit, slow.webhook_concurrency) == (100, 200, 10)
    fast = Environment.from_context("dev", with_value("dev", "provider_rpm", 60_000))
    assert (fast.webhook_rate_limit, fast.webhook_burst_limit, fast.webhook_concurrency) == (2000, 4000, 200)


def test_an_environment_defaults_its_step_settings_as_the_steps_do_unless_it_says_why() -> None:
    from dataclasses import MISSING, fields

    from sluice.contract import SETTING_DEFAULTS

    from infra.config import DEPLOYED_DEFAULTS, STEP_SETTINGS

    assert set(DEPLOYED_DEFAULTS) <= set(STEP_SETTINGS)
    for f in fields(Environment):
        if f.name in STEP_SETTINGS:
            default = f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default
            if f.default is MISSING and f.default_factory is MISSING:
                continue  # cdk.json must name it
            assert default == DEPLOYED_DEFAULTS.get(f.name, SETTING_DEFAULTS.get(f.name)), f.name


def test_every_step_setting_an_environment_names_reaches_the_steps() -> None:
    import aws_cdk.aws_dynamodb as dynamodb
    import aws_cdk.aws_s3 as s3
    import aws_cdk.aws_secretsmanager as secretsmanager
    from sluice.contract import Settings, parse_queue_tokens

    from infra.config import STEP_SETTINGS
    from infra.functions import lambda_environment

    chosen = {"budget_usd": 7.5, "rate_limits": {"gpt-4o": {"rpm": 500}}, "default_model": "gpt-4o-mini"}
    environments = copy.deepcopy(ENVIRONMENTS)
    environments["prod"].update(chosen)
    config = Environment.from_context("prod", environments)
    stack = cdk.Stack(cdk.App(), "T")
    table = dynamodb.Table(stack, "Tb", partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING))
    env = lambda_environment(
        config, bucket=s3.Bucket(stack, "B"), table=table, api_key=secretsmanager.Secret(stack, "S")
    )
    settings = Settings.from_env(env)
    assert {"concurrency", "map_concurrency", "ttl_days", "cache_ttl_days", "max_shards_in_flight"} <= set(
        STEP_SETTINGS
    )
    for name in STEP_SETTINGS:
        theirs = getattr(settings, name)
        if name == "batch_queue_tokens":
            theirs = parse_queue_tokens(theirs)
        elif name == "rate_limits":
            theirs = {"gpt-4o": {"rpm": 500}} if theirs == '{"gpt-4o": {"rpm": 500}}' else theirs
        assert theirs == getattr(config, name), name


@pytest.mark.parametrize(
    ("provider", "base_url"),
    [("anthropic", "https://api.anthropic.com"), ("gemini", "https://generativelanguage.googleapis.com")],
)
def test_an_environment_of_a_keyed_family_sends_its_steps_there_with_its_key(provider: str, base_url: str) -> None:
    from aws_cdk import assertions
    from sluice.contract import READS, Provider, ProviderKey
    from sluice.contract.definition import FUNCTION_PLACEHOLDERS

    context = copy.deepcopy(CONTEXT)
    dev = context["environments"]["dev"]
    dev["provider"] = provider
    del dev["provider_base_url"]
    app = cdk.App(context={**context, "aws:cdk:bundling-stacks": []})
    template = assertions.Template.from_stack(build_app(app, ["dev"])["dev"]).to_json()
    resources = template["Resources"]
    steps = {
        v["Properties"]["Handler"].split(".")[1]: v["Properties"]["Environment"]["Variables"]
        for v in resources.values()
        if v["Type"] == "AWS::Lambda::Function" and v["Properties"].get("Handler", "").startswith("sluice_handlers.")
    }
    steps = {name: variables for name, variables in steps.items() if name in FUNCTION_PLACEHOLDERS}
    assert steps
    secret = steps["run_shard"]["SLUICE_API_KEY_SECRET_ARN"]["Ref"]
    assert resources[secret]["Type"] == "AWS::SecretsManager::Secret"
    assert "API key for the LLM provider" in resources[secret]["Properties"]["Description"]
    for name, variables in steps.items():
        if Provider in READS[name]:
            assert variables["SLUICE_PROVIDER"] == provider, name
            assert variables["SLUICE_PROVIDER_BASE_URL"] == base_url, name
        if ProviderKey in READS[name]:
            assert variables["SLUICE_API_KEY_SECRET_ARN"] == {"Ref": secret}, name


def test_the_provider_is_one_of_the_families_and_names_its_own_api_by_default() -> None:
    assert Environment.from_context("dev", ENVIRONMENTS).provider == "openai"
    anthropic = with_value("dev", "provider", "anthropic")
    with pytest.raises(ConfigError, match="provider_base_url is the openai API, not anthropic's"):
        Environment.from_context("dev", anthropic)
    del anthropic["dev"]["provider_base_url"]
    assert Environment.from_context("dev", anthropic).provider_base_url == "https://api.anthropic.com"
    gemini = with_value("dev", "provider", "gemini")
    del gemini["dev"]["provider_base_url"]
    assert Environment.from_context("dev", gemini).provider_base_url == "https://generativelanguage.googleapis.com"
    gemini["dev"]["provider_base_url"] = "https://api.anthropic.com"
    with pytest.raises(ConfigError, match="provider_base_url is the anthropic API, not gemini's"):
        Environment.from_context("dev", gemini)
    with pytest.raises(ConfigError, match="environment 'dev': provider must be one of openai"):
        Environment.from_context("dev", with_value("dev", "provider", "mistral"))


def test_a_bedrock_environment_names_no_api_key() -> None:
    environments = copy.deepcopy(ENVIRONMENTS)
    environments["dev"].update(provider="bedrock", default_model="anthropic.claude-3-haiku-20240307-v1:0")
    for key in ("provider_base_url", "batch_queue_tokens"):
        environments["dev"].pop(key, None)
    assert Environment.from_context("dev", environments).provider == "bedrock"
    environments["dev"]["api_key_secret_arn"] = "arn:aws:secretsmanager:us-east-1:123456789012:secret:key-AbCdEf"
    with pytest.raises(
        ConfigError, match=r"api_key_secret_arn names a key, but bedrock signs with the functions' roles"
    ):
        Environment.from_context("dev", environments)
