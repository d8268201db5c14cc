"""Plan: the input read once and every line validated (`line_pass`), the job's options (`job_options`),
the response cache's plan side (`cache_plan`) and the shards and manifest (`plan`).

May import: everything below the runners (`sluice.contract`, `core`, `providers`, `formats`, `store`,
`limits`, `send`, `cache`, `shard`).
"""
