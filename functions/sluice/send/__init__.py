"""Sending requests and judging answers: the direct-mode engine's worker pool (`engine`), what an attempt's
answer means (`classify`), fail-fast on a provider that cannot answer (`refusal`), the process's
tuning while the engine runs (`process_tuning`) and an answer that fails its checks sent again
(`output_check`).

May import: `sluice.contract`, `sluice.core`, `sluice.providers`, `sluice.formats`, `sluice.limits`,
`sluice.store`.
"""
