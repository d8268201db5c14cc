"""The response cache: keys and the rows a shard fills (`entries`), the blobs it lives in (`blobs`), its
indexes (`index`), lookups (`lookup`) and compaction (`compact`). Plan's side is `sluice.plan.cache_plan`;
a shard run's fill is opened with the run (`sluice.shard.run.ShardRun`).

May import: `sluice.contract`, `sluice.core`, `sluice.providers`.
"""
