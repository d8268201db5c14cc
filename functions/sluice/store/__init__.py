"""The jobs table in DynamoDB: its key layout (`keys`), values in and out and conditional writes (`rows`),
the job, shard and item rows (`jobs`), the rows a webhook touches (`webhook_rows`) and a batch
shard's row (`batch_rows`, here because `JobStore` carries it).

May import: `sluice.contract`, `sluice.core`.
"""
