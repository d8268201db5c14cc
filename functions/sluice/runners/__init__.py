"""A shard's run in each mode: `direct`, `background`, `batch` (a package), a job's
`cancel`, and `webhooks`, which settle what a background or batch shard waits on.

May import: every package below it, `sluice.plan` (the manifest) and `sluice.merge` (a cancelled job
ends with its summary).
"""
