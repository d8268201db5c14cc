"""Flow control within a shard and across shards: the AIMD limit and token buckets (`flow`), one key
as a shard sees it (`local`), the shared limit's items and leases (`table`, `lease`, `shared`, and
`answers`: what an answer tells it), the job's spending cap (`budget`) and the provider's Batch
queue (`batch_queue`, `batch_queue_table`).

May import: `sluice.contract`, `sluice.core`, `sluice.providers`, `sluice.store`.
"""
