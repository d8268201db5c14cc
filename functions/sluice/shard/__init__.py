"""The frame every mode shares: what a shard is and how it reads its lines and sends (`frame`), its
checkpoint parts and their assembly (`parts`), its figures (`stats`) and live progress (`progress`).

May import: `sluice.contract`, `sluice.core`, `sluice.providers`, `sluice.formats`, `sluice.store`,
`sluice.limits`, `sluice.send`, `sluice.cache`.
"""
