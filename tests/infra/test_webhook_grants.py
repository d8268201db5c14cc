"""The webhook Lambda's grants are exact, so its calls must stay within them: run it and watch."""

from __future__ import annotations

from typing import Any

from sluice.store.jobs import JobStore
from sluice_handlers import webhook

from infra.stack import PROVIDER_ID_INDEX, WEBHOOK_INDEX_ACTIONS, WEBHOOK_TABLE_ACTIONS
from tests.unit.helpers.observability import call, deployed_webhook, provider_event, signed

__all__ = ["deployed_webhook"]


def test_the_webhook_handler_calls_only_what_the_stack_grants(deployed_webhook: JobStore) -> None:
    store, sfn, secrets, _ = webhook._clients("sluice-webhook")
    called: set[tuple[str, str]] = set()

    def record(service: str) -> Any:
        def hook(model: Any, params: dict[str, Any], **_: Any) -> None:
            index = params.get("IndexName")
            called.add((f"{service}:{model.name}", f"index/{index}" if index else "table"))

        return hook

    store._table.meta.client.meta.events.register("before-parameter-build.dynamodb", record("dynamodb"))
    sfn.meta.events.register("before-parameter-build.sfn", record("states"))
    secrets.client.meta.events.register("before-parameter-build.secrets-manager", record("secretsmanager"))
    assert store.arm_shard("job", 0, "token-0") is False

    response = provider_event("response.completed", "resp_a")
    batch = provider_event("batch.completed", "batch_1")
    for body, msg_id in ((response, "m1"), (response, "m1"), (batch, "m2"), (b"{}", "m3")):
        assert call(body, signed(body, msg_id=msg_id))["statusCode"] in (200, 400)

    assert {action for action, on in called if on == "table" and action.startswith("dynamodb:")} == set(
        WEBHOOK_TABLE_ACTIONS
    )
    assert {action for action, on in called if on.startswith("index/")} == set(WEBHOOK_INDEX_ACTIONS)
    assert {on for _, on in called if on.startswith("index/")} == {f"index/{PROVIDER_ID_INDEX}"}
    assert ("secretsmanager:GetSecretValue", "table") in called
    assert ("states:SendTaskSuccess", "table") in called  # the settled item woke the armed shard
