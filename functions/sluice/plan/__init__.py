"""Plan: the input read once and every line validated (`line_pass`), the job's options (`job_options`),
the response cache's plan side (`cache_plan`), a job's deadline (`deadline`: reading it and the pure
plan of batch, flex or direct per shard with its cutover; `deadline_plan`: that plan's inputs from
Plan's options, settings and shards; `turnarounds`: the batch turnarounds measured of earlier jobs,
which Merge keeps and a deadline's plan reads) and the shards and manifest (`plan`).

May import: everything below the runners (`sluice.contract`, `core`, `providers`, `formats`, `store`,
`limits`, `send`, `cache`, `shard`).
"""
