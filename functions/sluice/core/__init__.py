"""Small policies and formats every stage shares, below the providers: when to retry and how long to
wait (`retry`), which AWS errors a step runs again (`aws_errors`), list prices (`costs`) and the
OpenAI Batch output records (`records`).

May import: `sluice.contract`.
"""
