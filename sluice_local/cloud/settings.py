"""What a local run may choose of the steps' settings, with the contract's local defaults."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.contract import LOCAL_SETTING_DEFAULTS


@dataclass
class LocalSettings:
    """The steps' settings a local run may choose (`sluice.contract.Settings`), and the Lambda timeout."""

    concurrency: int = LOCAL_SETTING_DEFAULTS["concurrency"]
    # fewer shards at once than deployed: they share this machine's cores
    map_concurrency: int = LOCAL_SETTING_DEFAULTS["map_concurrency"]
    # shards at once across the run's jobs (`sluice.limits.shard_slots`); 0: no cap, as on one machine
    max_shards_in_flight: int = LOCAL_SETTING_DEFAULTS["max_shards_in_flight"]
    max_attempts: int = LOCAL_SETTING_DEFAULTS["max_attempts"]
    request_timeout_s: float = LOCAL_SETTING_DEFAULTS["request_timeout_s"]
    shard_lines: int = LOCAL_SETTING_DEFAULTS["shard_lines"]
    # the simulator answers in seconds: a background shard need not wait 10 s to look again
    poll_seconds: int = LOCAL_SETTING_DEFAULTS["poll_seconds"]
    lambda_timeout_s: float = 900.0
    safety_margin_s: float = LOCAL_SETTING_DEFAULTS["safety_margin_s"]
    retry_base_delay_s: float = LOCAL_SETTING_DEFAULTS["retry_base_delay_s"]
    batch_max_requests: int = LOCAL_SETTING_DEFAULTS["batch_max_requests"]
    auto_batch_min_requests: int = LOCAL_SETTING_DEFAULTS["auto_batch_min_requests"]
    on_batch_incomplete: str = LOCAL_SETTING_DEFAULTS["on_batch_incomplete"]
    default_mode: str = LOCAL_SETTING_DEFAULTS["default_mode"]
    default_model: str | None = LOCAL_SETTING_DEFAULTS["default_model"]
    shared_limit: str = LOCAL_SETTING_DEFAULTS["shared_limit"]
    batch_queue_tokens: str = LOCAL_SETTING_DEFAULTS["batch_queue_tokens"]
    batch_queue_default_tokens: int = LOCAL_SETTING_DEFAULTS["batch_queue_default_tokens"]
    # how long a cancelled batch takes to end (a deadline job's margin): the simulator's, a phase
    batch_cancel_s: float = LOCAL_SETTING_DEFAULTS["batch_cancel_s"]
    # the provider's limits per model, as cdk.json's `rate_limits` (`sluice.contract.parse_rate_limits`)
    rate_limits: str | None = LOCAL_SETTING_DEFAULTS["rate_limits"]
    cache: str = LOCAL_SETTING_DEFAULTS["cache"]
    # None: the response cache lives in the (moto) bucket, as deployed; `sluice run` gives a directory
    cache_dir: str | None = None
    cache_provider: str | None = None
    # the provider family the provider base URL speaks (`sluice.contract.PROVIDERS`)
    provider: str = LOCAL_SETTING_DEFAULTS["provider"]
    # moto keeps every object: a test makes answers old to see them expire
    cache_ttl_days: int = LOCAL_SETTING_DEFAULTS["cache_ttl_days"]
