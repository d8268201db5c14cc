"""Batch mode: a shard's rows cut into files (`files`), submitted (`submit`), advanced as batches end
or wait in the queue (`advance`) and collected into shard parts (`collect`); a deadline job's batch
not ended by its shard's `cutover_at` cancelled, its answers kept and the rest sent direct (`cutover`).

May import: the shard and everything below it (contract, core, providers, formats, store, limits,
send, cache); not plan, merge or the other runners.
"""
