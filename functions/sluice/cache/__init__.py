"""The response cache: keys and the rows a shard fills (`entries`), the blobs it lives in (`blobs`), its
indexes (`index`), lookups (`lookup`) and compaction (`compact`). Plan's side is `sluice.plan.cache_plan`;
a shard's fill is opened by the frame (`sluice.shard.frame.fill_for`).

May import: `sluice.contract`, `sluice.core`, `sluice.providers`.
"""
