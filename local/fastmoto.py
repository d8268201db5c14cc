"""Work moto repeats on every request or state, done once per local cloud instead.

A job of 1,200 shards makes about 20,000 AWS calls and 10,000 state transitions in one process;
profiled, most of its time went to three things moto recomputes from inputs that never change
while the local cloud runs: the answers are the same, only cached.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

# what the local cloud calls, most often first
SERVICES = ("s3", "dynamodb", "stepfunctions", "secretsmanager", "events", "sts", "iam")


def _eval_pool(self: Any, job: Any, worker_frame: Any) -> None:
    """moto's DistributedItemProcessorWorker._eval_pool, as a loop: moto recurses once per
    child, so a worker that runs 1,000 children hits Python's recursion limit."""
    while True:
        if job is None:
            self._env.delete_frame(worker_frame)
            return
        job_frame = worker_frame.open_inner_frame()
        self._eval_job(env=job_frame, job=job)
        worker_frame.delete_frame(job_frame)
        if isinstance(job.job_output, Exception) or self.stopped():
            self._env.delete_frame(worker_frame)
            self._job_pool.close_job(job)
            return
        next_job = self._job_pool.next_job()
        if next_job is None:
            self._env.delete_frame(worker_frame)
            self._job_pool.close_job(job)
            return
        self._job_pool.close_job(job)
        job = next_job


def _prefix_listing(list_objects: Any) -> Any:
    """S3Backend.list_objects walks every key of the bucket through the versioned store for
    each listing; a job of 1,200 shards holds ~10,000 keys and lists ~2,400 times. Filter the
    names first (a C-level scan), and let moto list only those."""

    def listed(self: Any, bucket: Any, prefix: str | None, *args: Any, **kwargs: Any) -> Any:
        store = getattr(bucket, "keys", None)
        if not prefix or not isinstance(store, dict):
            return list_objects(self, bucket, prefix, *args, **kwargs)
        subset = type(store)()
        # list() copies the names in one step under the GIL; other threads add keys meanwhile
        for name in [n for n in list(dict.keys(store)) if n.startswith(prefix)]:
            dict.__setitem__(subset, name, dict.__getitem__(store, name))
        view = copy.copy(bucket)
        view.keys = subset
        return list_objects(self, view, prefix, *args, **kwargs)

    return listed


@contextmanager
def faster() -> Iterator[None]:
    from moto import backend_index
    from moto.core.base_backend import BaseBackend
    from moto.s3 import models as s3_models
    from moto.s3 import urls as s3_urls
    from moto.stepfunctions.parser.asl.component.common.path import result_path
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration.itemprocessor import (
        distributed_item_processor_worker as worker,
    )
    from moto.stepfunctions.parser.asl.utils import json_path

    # S3's backend re-imports (importlib.reload) moto.s3.urls twice per request, in case the
    # environment changed which URLs it serves; it does not change during a run
    def s3_url_module(self: Any) -> Any:
        return s3_urls

    # every request rebuilds each candidate backend's whole URL table
    urls = BaseBackend.urls
    by_class: dict[type, Any] = {}

    def cached_urls(self: Any) -> Any:
        table = by_class.get(type(self))
        if table is None:
            table = by_class[type(self)] = urls.fget(self)  # type: ignore[attr-defined]
        return table

    # every request tries each service's URL pattern in turn, S3's after 200 others; the first
    # match wins, and none before ours matches our URLs, so trying ours first routes the same
    patterns = backend_index.backend_url_patterns
    ours = [p for p in patterns if p[0] in SERVICES]
    ours.sort(key=lambda p: SERVICES.index(p[0]))
    reordered = ours + [p for p in patterns if p[0] not in SERVICES]

    # the interpreter parses each JSONPath afresh, and jsonpath_ng builds a yacc parser per parse
    with ExitStack() as stack:
        patch = stack.enter_context
        patch(mock.patch.object(s3_models.S3Backend, "_url_module", property(s3_url_module)))
        patch(mock.patch.object(BaseBackend, "urls", property(cached_urls)))
        patch(mock.patch.object(json_path, "parse", functools.lru_cache(maxsize=1024)(json_path.parse)))
        patch(mock.patch.object(result_path, "parse", functools.lru_cache(maxsize=1024)(result_path.parse)))
        patch(mock.patch.object(backend_index, "backend_url_patterns", reordered))
        listing = _prefix_listing(s3_models.S3Backend.list_objects)
        patch(mock.patch.object(s3_models.S3Backend, "list_objects", listing))
        patch(mock.patch.object(worker.DistributedItemProcessorWorker, "_eval_pool", _eval_pool))
        yield
