"""The end of a job: shard outputs read (`outputs`) and merged in input order (`merge`), the summary
(`summary`), the invariant checker (`verify`), MarkFailed for a job that cannot finish
(`mark_failed`) and the job's events (`notify`).

May import: `sluice.contract`, `core`, `providers`, `formats`, `store`, `limits`, `send`, `cache`,
`shard`, `plan`; never a runner.
"""
