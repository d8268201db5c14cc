"""The Lambda functions: one per state machine step, and the webhook receiver."""

from __future__ import annotations

from dataclasses import dataclass

# A shard Lambda drives hundreds of sockets and parses every response; 1769 MB is the size at
# which Lambda gives a full vCPU.
FULL_VCPU_MB = 1769


@dataclass(frozen=True)
class Step:
    """One Lambda function: its handler module, timeout and memory."""

    name: str
    timeout_s: int
    memory_mb: int = 1024

    @property
    def module(self) -> str:
        return f"sluice_handlers.{self.name}"

    @property
    def handler(self) -> str:
        return f"{self.module}.handler"

    @property
    def construct_id(self) -> str:
        return "".join(part.title() for part in self.name.split("_"))

    @property
    def placeholder(self) -> str:
        """The `${...}` the state machine definition names the function's ARN by."""
        return f"{self.construct_id}FunctionArn"


# One function per state machine step. Steps that work through a shard get Lambda's maximum
# (15 minutes), so that they can drain and checkpoint before the workflow loops them.
STEPS: dict[str, Step] = {
    step.name: step
    for step in (
        # Plan keeps about 20 bytes a line (`sluice.plan.line_pass`: its offset, and a 12-byte hash of its
        # custom_id until duplicates are settled), 200 MB at 10M lines; the rest is the cache's lookups
        Step("plan", 900, 3008),
        # a slot among the environment's shards in flight, taken before a shard runs and given back
        # at its end (`sluice.limits.shard_slots`): a read and a write or two
        Step("take_slot", 30),
        Step("give_back_slot", 30),
        Step("run_shard", 900, FULL_VCPU_MB),
        Step("submit", 900),
        Step("await_shard", 30),
        Step("collect", 900),
        Step("submit_batch", 900),
        Step("collect_batch", 900),
        # a shard whose step failed after its retries: cancels its open work, writes its outputs
        Step("fail_shard", 900),
        Step("merge", 900),
        Step("notify", 30),
        Step("mark_failed", 900),
    )
}

# Not a step of the state machine: API Gateway calls it for each provider webhook. It answers
# within a second or two (API Gateway gives up at 30 s, providers sooner); 512 MB buys the CPU
# for a quick cold start.
WEBHOOK = Step("webhook", 10, 512)

# The steps that talk to the provider and work through their shard's rows and checkpoints.
PROVIDER_STEPS = ("run_shard", "submit", "collect", "submit_batch", "collect_batch")
# The step that ends a failed shard: it reaches the provider only to cancel the shard's open work.
SHARD_FAILED_STEP = "fail_shard"
