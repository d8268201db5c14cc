"""The frame every mode shares: what a shard is and how it reads its lines and sends (`frame`), its
checkpoint parts (`parts`) and their assembly into the shard's outputs (`assembly`), a run as its
runner opens it (`run`: the checkpoint, the run's number, its writer and cache fill, read once), its
figures (`stats`) and live progress (`progress`).

May import: `sluice.contract`, `sluice.core`, `sluice.providers`, `sluice.formats`, `sluice.store`,
`sluice.limits`, `sluice.send`, `sluice.cache`.
"""
