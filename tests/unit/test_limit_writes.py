"""What a shard's run writes to the key's shared limit: a run that knows how many lines it has left
leases no more than those, so its end gives nothing back (at a thousand shards, a lease and a
give-back a moment apart in every run's end took the key's item past half its writes)."""

from __future__ import annotations

from dataclasses import replace

from sluice.limits.shared import limit_key
from sluice.limits.table import BucketTable

from tests.unit.helpers.cancel import Aws
from tests.unit.helpers.engine import Scripted
from tests.unit.helpers.sweep import aws, run, shard  # noqa: F401  (the fixture)


def test_a_run_of_a_few_lines_writes_the_keys_item_once_beyond_its_seed(aws: Aws) -> None:  # noqa: F811
    spec = shard(aws, ["a", "b", "c"])
    aws.settings = replace(aws.settings, rate_limits='{"gpt-4o-mini": {"rpm": 30000}}')
    provider = Scripted()

    out = run(aws, provider, spec)

    assert out["done"] is True and len(provider.log) == 3
    item = BucketTable(aws.store.table).load(limit_key(provider.base_url, "sk-test", "gpt-4o-mini"))
    # every write of the item adds one to its version: the seed, then one lease of three requests
    assert item is not None and item.version == 2
