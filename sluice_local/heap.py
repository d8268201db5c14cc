"""The C heap of a local run: a few malloc arenas, not one a thread.

A local run answers every step, Map child and simulator request on threads of its own (some 60
at once), and glibc gives each thread that allocates under contention an arena of its own, up to
eight a core. Memory freed in one arena serves only that arena, so a run's resident memory grew
past what its objects held: measured on 100,000 lines, a peak of 707 MB with glibc's default and
522 MB with two arenas, at the same speed. This only caps the arenas; what a run holds is bounded
where it is held.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt's parameter for the most arenas (malloc.h)
M_ARENA_MAX = -8
ARENAS = 2


def few_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process; False where there is no glibc to ask."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        # musl and other C libraries have no mallopt
        return False
