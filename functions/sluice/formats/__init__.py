"""What a line in and an answer out must look like: input lines read and validated (`lines`) and an
answer judged against the job's checks (`validation`).

May import: `sluice.contract`, `sluice.core`, `sluice.providers`.
"""
