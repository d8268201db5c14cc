"""What the direct-mode engine tunes for the whole process while it runs: the garbage collector,
and glibc's mmap threshold for the read buffers asyncio allocates (`sluice.send.engine`)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_GC_GEN0 = 20_000
# above asyncio's per-read buffer (256 KiB); see keep_read_buffers_off_mmap
_MMAP_THRESHOLD_HINT = 1 << 20


class _GcTuning:
    """Fewer, cheaper garbage collections while any engine in the process runs.

    Every request allocates a few hundred short-lived containers, so the default gen-0
    threshold (700) runs a collection every couple of requests, and the older generations
    rescan every long-lived module object each time. Freezing what exists and collecting less
    often cuts ~10% of the engine's CPU. The collector is process-wide and the local cloud
    runs many shards at once on threads, so the first engine in tunes it and the last one out
    restores it; asking `gc.get_freeze_count()` per shard instead walks every frozen object,
    which in a local cloud holding millions of them cost ~0.1 s of CPU per shard.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._threshold = gc.get_threshold()
        self._unfreeze = False

    @contextmanager
    def __call__(self, enabled: bool) -> Iterator[None]:
        if not enabled:
            yield
            return
        with self._lock:
            if self._users == 0:
                self._threshold = gc.get_threshold()
                # nothing of ours is frozen now, so this counts only a freeze the caller made,
                # which it is left to undo
                self._unfreeze = gc.get_freeze_count() == 0
                gc.freeze()
                gc.set_threshold(max(self._threshold[0], _GC_GEN0), *self._threshold[1:])
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    gc.set_threshold(*self._threshold)
                    if self._unfreeze:
                        gc.unfreeze()


tuned_gc = _GcTuning()


def keep_read_buffers_off_mmap() -> None:
    """asyncio's selector transports read every response into a fresh 256 KiB bytes object.
    glibc serves blocks that size with mmap until a freed mmapped block teaches it a higher
    threshold, so without this every read costs an mmap, an mremap, a munmap and page
    faults: about a fifth of the CPU per request in bench/engine.py. Freeing one larger
    block raises glibc's threshold for the life of the process (two syscalls, so it is
    cheap to repeat per call); with another allocator it is just a short-lived allocation."""
    block = bytes(_MMAP_THRESHOLD_HINT)
    del block
