"""Every change the local cloud makes to moto's internals, entered in one place (`applied`), for one moto version.

moto implements the AWS APIs in-process; the local cloud needs four kinds of change to it:
- routing: the interpreter's Lambda calls go to the handlers in this process (moto's Lambda
  would need Docker), and the Map's ItemReader reads as the state machine's role;
- consistency: DynamoDB's single-item atomicity, which moto's unlocked updates lack, and
  StopExecution's finality, which an error raised after the stop overwrites in moto;
- quotas: what AWS refuses and moto accepts (`sluice_local.moto_quotas`, numbers in `sluice_local.quotas`);
- speed: work moto repeats per request that a local run can do once (`faster`).
All of it reaches into modules moto does not promise to keep, so `applied` refuses to run on a
moto other than the one it was written for (tests/unit/test_moto_patches.py says so first).
"""

from __future__ import annotations

import copy
import functools
import json
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import Any
from unittest import mock

import boto3
import moto
from botocore.config import Config
from moto.core.base_backend import BackendDict
from moto.dynamodb.responses import DynamoHandler
from moto.stepfunctions.parser.asl.component.state.exec.state_map.item_reader.eval import resource_eval_s3
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
from moto.stepfunctions.parser.asl.eval.environment import Environment
from moto.stepfunctions.parser.asl.eval.program_state import ProgramStopped
from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser
from moto.stepfunctions.parser.asl.parse.preprocessor import Preprocessor
from moto.stepfunctions.parser.models import StepFunctionsParserBackend
from sluice.contract import causes

from sluice_local import dynamo_meter as meter
from sluice_local import ledger as calls
from sluice_local import moto_s3_disk
from sluice_local import quotas as q
from sluice_local.moto_quotas import quota_checks

# the moto these patches were written against and tested with (requirements.txt pins it)
WRITTEN_FOR = "5.2.5"

# what the local cloud calls, most often first
SERVICES = ("s3", "dynamodb", "stepfunctions", "secretsmanager", "events", "sts", "iam")

LambdaInvoke = Callable[[dict[str, Any], str, Any], dict[str, Any]]


class UnsupportedMoto(RuntimeError):
    pass


def check_version(installed: str | None = None) -> None:
    installed = installed or moto.__version__
    if installed != WRITTEN_FOR:
        raise UnsupportedMoto(
            f"the local cloud patches moto's internals as of moto {WRITTEN_FOR}, and moto {installed} is "
            "installed; install the pinned version (pip install -r requirements.txt) "
            "or port sluice_local/moto_patches.py"
        )


@contextmanager
def applied(
    *,
    invoke: LambdaInvoke,
    workflow: boto3.Session,
    ledger: q.Ledger,
    recorded: calls.CallLedger,
    tables: meter.Tables,
) -> Iterator[None]:
    """All of the patches, while the local cloud runs (inside `mock_aws`)."""
    check_version()
    with ExitStack() as stack:
        # first: the quota checks wrap its upload completion, as they would moto's own
        stack.enter_context(moto_s3_disk.on_disk())
        stack.enter_context(routed(invoke, workflow))
        stack.enter_context(consistent())
        stack.enter_context(quota_checks(ledger))
        stack.enter_context(metered(recorded, tables))
        stack.enter_context(faster())
        stack.enter_context(untracked())
        yield


@contextmanager
def routed(invoke: LambdaInvoke, workflow: boto3.Session) -> Iterator[None]:
    # moto's Map reads its ItemReader with fixed keys moto does not know; the state machine
    # reads with its own role
    def item_reader_client(region: str, service: str, state_credentials: Any = None) -> Any:
        return workflow.client(service, region_name=region, config=Config(retries={"total_max_attempts": 1}))

    with (
        mock.patch.object(lambda_eval_utils, "_invoke_lambda_function", invoke),
        mock.patch.object(resource_eval_s3, "boto_client_for", item_reader_client),
    ):
        yield


_create_account_specific_backend = BackendDict._create_account_specific_backend


def _known_backend_fast_path(self: BackendDict, account_id: str) -> None:  # type: ignore[type-arg]
    """moto checks `self not in BackendDict._instances` on every request, which compares whole
    backends by value; with tens of thousands of rows that check dominated a local job's CPU.
    An identity check answers the same question for a backend that already exists."""
    known = BackendDict._instances  # type: ignore[misc]
    if account_id in self.keys() and any(instance is self for instance in known):
        return
    _create_account_specific_backend(self, account_id)


_dynamodb_call_action = DynamoHandler.call_action
_dynamodb_calls = threading.RLock()


def _atomic_dynamodb_call(self: DynamoHandler) -> Any:
    """DynamoDB applies each single-item write atomically; moto computes an update's new
    values and writes them back with no lock. Two webhooks settling a shard's last two items
    on two receiver threads could both read `waiting` 2 and both write 1, and the shard
    slept until its poll timeout. One DynamoDB call at a time gives back the service's
    guarantee; the GIL already ran them one at a time for most of their length."""
    with _dynamodb_calls:
        return _dynamodb_call_action(self)


_set_error = Environment.set_error


def _stop_is_final(self: Environment, error: Any) -> None:
    """StopExecution ends an execution ABORTED, and the children of its Map with it, whatever
    happens after. moto lets an error raised after the stop replace it: a shard's waitForTaskToken
    task, cut short by the stop, raises States.Timeout, the Map counts that child failed, fails
    on its tolerance, and a cancelled job's execution ended FAILED."""
    with self._state_mutex:
        if not isinstance(self._program_state, ProgramStopped):
            _set_error(self, error)


@contextmanager
def consistent() -> Iterator[None]:
    with (
        mock.patch.object(BackendDict, "_create_account_specific_backend", _known_backend_fast_path),
        mock.patch.object(DynamoHandler, "call_action", _atomic_dynamodb_call),
        mock.patch.object(Environment, "set_error", _stop_is_final),
    ):
        yield


@contextmanager
def metered(ledger: calls.CallLedger, tables: meter.Tables) -> Iterator[None]:
    """Every request moto answers, in the ledger with what AWS counts for it; a DynamoDB request
    under the lock that makes it atomic, so the item sizes before and after it are its own."""
    from moto.core.botocore_stubber import BotocoreStubber

    answer = BotocoreStubber.__call__

    def timed(*args: Any, **kwargs: Any) -> tuple[Any, tuple[float, float]]:
        started, cpu = time.perf_counter(), time.thread_time()
        response = answer(*args, **kwargs)
        return response, (time.perf_counter() - started, time.thread_time() - cpu)

    def stubbed(self: Any, event_name: str, request: Any, **kwargs: Any) -> Any:
        if not self.enabled:
            return answer(self, event_name, request, **kwargs)
        _, service, operation = event_name.split(".", 2)
        caller, at = ledger.caller(calls.header(request, "Authorization")), ledger.now()
        if service != "dynamodb":
            response, spent = timed(self, event_name, request, **kwargs)
            ledger.answered(service, operation, caller, at, spent, request, response)
            return response
        with _dynamodb_calls:
            pending = meter.DynamoRequest(operation, json.loads(request.body or b"{}"), tables)
            response, spent = timed(self, event_name, request, **kwargs)
            ledger.add(pending.records(caller, at, spent, response))
        return response

    causes.observe(ledger.occurred)
    try:
        with mock.patch.object(BotocoreStubber, "__call__", stubbed), calls.attributed():
            yield
    finally:
        causes.observe(None)


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


_parse = AmazonStateLanguageParser.parse
_validate = StepFunctionsParserBackend._validate_definition
# each definition's parse tree, once parsed in this process
_trees: dict[str, Any] = {}


def _parsed_once(definition: str) -> tuple[Any, Any]:
    """moto parses the definition with ANTLR when the state machine is created and again for
    every execution, about a second each; only the tree's evaluation components (`Preprocessor`)
    belong to one execution, and they are built afresh from the tree, which nothing changes."""
    tree = _trees.get(definition)
    if tree is None:
        program, tree = _parse(definition)
        _trees[definition] = tree
        return program, tree
    return Preprocessor().visit(tree), tree


def _validate_once(definition: str) -> None:
    if definition not in _trees:
        _validate(definition)


@contextmanager
def parsed_once() -> Iterator[None]:
    """Definitions parsed once per process, and validated once (a valid definition parsed whole):
    entered before the state machine is created."""
    with (
        mock.patch.object(AmazonStateLanguageParser, "parse", staticmethod(_parsed_once)),
        mock.patch.object(StepFunctionsParserBackend, "_validate_definition", staticmethod(_validate_once)),
    ):
        yield


@contextmanager
def faster() -> Iterator[None]:
    """Work moto repeats on every request or state, done once per local cloud instead.

    A job of 1,200 shards makes about 20,000 AWS calls and 10,000 state transitions in one
    process; profiled, most of its time went to what moto recomputes from inputs that never
    change while the local cloud runs: the answers are the same, only cached."""
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


class _Live:
    """A model class's `instances_tracked` that holds no instance alive: the ones still in use."""

    def __init__(self) -> None:
        self._instances: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def append(self, instance: Any) -> None:
        # a model with __slots__ and no weak reference goes untracked: moto's reset disposes of none
        with suppress(TypeError):
            self._instances[id(instance)] = instance

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._instances.values()))

    def __len__(self) -> int:
        return len(self._instances)


@contextmanager
def untracked() -> Iterator[None]:
    """moto's models no longer kept for ever once replaced.

    moto appends every model object it makes (each DynamoDB item written, each S3 object and its
    ACL, each upload) to a list of its class's, for its dashboard and its reset, and nothing ever
    removes one: a local run kept every version of every row and object it wrote, about 170
    bytes a line. Here each class tracks the instances still in use, which is all its reset
    needs; what was tracked before is tracked again after."""
    from moto.core.model_instances import model_data

    classes: list[Any] = [cls for models in model_data.values() for cls in models.values()]
    before = [(cls, cls.instances_tracked) for cls in classes]
    for cls in classes:
        cls.instances_tracked = _Live()
    try:
        yield
    finally:
        for cls, tracked in before:
            cls.instances_tracked = tracked
