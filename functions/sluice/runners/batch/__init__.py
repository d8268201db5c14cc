"""Batch mode: a shard's rows cut into files (`files`), submitted (`submit`), advanced as batches end
or wait in the queue (`advance`) and collected into shard parts (`collect`).

May import: what `sluice.runners` may, but not the other runners.
"""
