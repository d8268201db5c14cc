"""Providers: per family, its request format and, where it has them, its Batch and background APIs
behind small protocols (`batch.BatchApi`, `background.BackgroundApi`). Only this package imports a
provider SDK or knows a provider's wire shape; `family` says which family a deployment talks to.
"""

from .background import BackgroundApi, Settled
from .batch import BatchApi, BatchApiOpener, BatchLimits, BatchRow, BatchStatus, BatchTag, BatchUpload

__all__ = [
    "BackgroundApi",
    "BatchApi",
    "BatchApiOpener",
    "BatchLimits",
    "BatchRow",
    "BatchStatus",
    "BatchTag",
    "BatchUpload",
    "Settled",
]
