"""AWS calls in the core that no declared cause reaches, found by reading the code, not by a run.

The counted runs (`runs.py`) see the calls of the paths they take; a call in a branch no run takes
would go uncounted. This reads every module of the core and the handlers instead. An AWS call is
an attribute named as a boto3 operation of the services Sluice uses (called, or handed on to be
called, as `asyncio.to_thread(self._bedrock.get_model_invocation_job, ...)` is), one of boto3's
injected helpers (`get_paginator`, `batch_writer`, `upload_fileobj`, ...), a secret's read
(`SecretsProvider.get`), or a signed request (`sign(...)`: a Bedrock runtime request).

A call is declared when it sits in a `with` whose context names `because` (or a value made by
it), in a function decorated `@caused(...)` or `@under(...)` (its calls run under the causes its
callers declare),
or in a function every reference to which is declared, followed caller by caller. References are
resolved by name, which over-approximates: a method is every method of its name, a function every
function of its name. A path that reaches a function no code references (a handler, a dunder)
without passing a declaration is an undeclared call.
"""

from __future__ import annotations

import ast
import io
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import botocore.session
from botocore import xform_name

ROOT = Path(__file__).resolve().parents[2]
CORE = (ROOT / "functions" / "sluice", ROOT / "functions" / "sluice_handlers")
# every service a step's role is granted, and what the core reaches through boto3
SERVICES = ("s3", "dynamodb", "stepfunctions", "secretsmanager", "events", "bedrock", "bedrock-runtime", "sts")
# boto3's own methods that make requests: not in the service models
HELPERS = frozenset(
    {"get_paginator", "batch_writer", "upload_fileobj", "download_fileobj", "upload_file", "download_file"}
)
# a signed Bedrock runtime request (`sluice.providers.bedrock.auth.signer`), and a secret read through
# Powertools' provider: called by these names
CALLED = frozenset({"sign"})
SECRET_READ = "get"
SECRET_PROVIDERS = frozenset({"secrets"})
DECLARING = frozenset({"because", "caused", "under"})
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# calls that call the function they are handed, on a thread, a loop or a retry (an argument named
# otherwise is a value, not a call)
LATER = frozenset({"to_thread", "partial", "submit", "run_in_executor", "_call", "conditional", "map", "create_task"})


@cache
def operations() -> frozenset[str]:
    session = botocore.session.get_session()
    found = {xform_name(op) for s in SERVICES for op in session.get_service_model(s).operation_names}
    return frozenset(found | HELPERS)


@dataclass(frozen=True)
class Undeclared:
    """An AWS call, and the chain of functions from it to one that no code references."""

    where: str
    chain: tuple[str, ...]

    def line(self) -> str:
        return f"{self.where} under no cause, by way of {' <- '.join(self.chain)}"


class _Module:
    def __init__(self, name: str, tree: ast.Module) -> None:
        self.name = name
        self.tree = tree
        self.parent: dict[ast.AST, ast.AST] = {}
        self.imported: set[str] = set()
        # names brought in by `from ... import name`: a function of another module called by its name
        self.names_from: set[str] = set()
        self.defined: set[str] = set()
        # the modules it imports from, dotted (`sluice.store.jobs`)
        self.sources: set[str] = set()
        package = name.removeprefix("functions/").removesuffix(".py").replace("/", ".").split(".")[:-1]
        self.nodes = list(ast.walk(tree))
        # per function, the names it binds to a declaration (`writing = because(...)`)
        self.made: dict[ast.AST, set[str]] = {}
        for node in self.nodes:
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
            if isinstance(node, ast.Import):
                self.imported |= {a.asname or a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                self.imported |= {a.asname or a.name for a in node.names}
                self.names_from |= {a.asname or a.name for a in node.names}
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join([*base, *([node.module] if node.module else [])])
                self.sources |= {source, *(f"{source}.{a.name}" for a in node.names)}
            elif isinstance(node, FUNCTIONS):
                self.defined.add(node.name)

    @property
    def dotted(self) -> str:
        return self.name.removeprefix("functions/").removesuffix(".py").replace("/", ".").removesuffix(".__init__")

    def function_of(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, FUNCTIONS):
                return node
        return None

    def is_method(self, fn: ast.AST) -> bool:
        return isinstance(self.parent.get(fn), ast.ClassDef)

    def label(self, fn: ast.AST | None, node: ast.AST) -> str:
        name = fn.name if isinstance(fn, FUNCTIONS) else "<module>"
        return f"{self.name}:{getattr(node, 'lineno', 0)} {name}"


def _called_names(expr: ast.AST) -> Iterator[str]:
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                yield func.attr
            elif isinstance(func, ast.Name):
                yield func.id


def _declares(expr: ast.AST) -> bool:
    return not DECLARING.isdisjoint(_called_names(expr))


def _declared_at(module: _Module, node: ast.AST) -> bool:
    """Whether `node` runs under a cause its own function declares."""
    fn = module.function_of(node)
    made: set[str] = set()
    if fn is not None:
        if fn not in module.made:
            module.made[fn] = {
                t.id
                for assign in ast.walk(fn)
                if isinstance(assign, ast.Assign) and _declares(assign.value)
                for t in assign.targets
                if isinstance(t, ast.Name)
            }
        made = module.made[fn]
    at = node
    while at in module.parent:
        at = module.parent[at]
        if isinstance(at, ast.With | ast.AsyncWith):
            for item in at.items:
                names = {n.id for n in ast.walk(item.context_expr) if isinstance(n, ast.Name)}
                if _declares(item.context_expr) or names & made:
                    return True
        if isinstance(at, FUNCTIONS):
            return any(_declares(d) for d in at.decorator_list)
    return False


def _is_call(module: _Module, node: ast.AST, ops: frozenset[str]) -> bool:
    if isinstance(node, ast.Attribute):
        base = node.value
        if isinstance(base, ast.Name) and base.id in module.imported:
            return False
        if node.attr in ops:
            return True
        # Powertools' SecretsProvider: `secrets.get(arn, ...)`
        return node.attr == SECRET_READ and isinstance(base, ast.Name) and base.id in SECRET_PROVIDERS
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CALLED


def _used(module: _Module, node: ast.Attribute) -> bool:
    """Whether an attribute is called, or handed to one of the calls that call it later
    (`asyncio.to_thread(self.table.load, ...)`), not merely read (`resp.status`, `f(x.status)`)."""
    up = module.parent.get(node)
    if not isinstance(up, ast.Call):
        return False
    if up.func is node:
        return True
    func = up.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in LATER


def modules(roots: Iterable[Path] = CORE, replaced: dict[str, str] | None = None) -> list[_Module]:
    """The core's modules, parsed; `replaced`: sources read instead of the files at those paths
    (relative to the repository), as a test plants a call."""
    found = []
    replaced = replaced or {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            name = str(path.relative_to(ROOT))
            found.append(_parsed(name, replaced[name] if name in replaced else path.read_text()))
    return found


@cache
def _parsed(name: str, source: str) -> _Module:
    return _Module(name, ast.parse(source, name))


def undeclared(mods: list[_Module]) -> list[Undeclared]:
    """Every AWS call no declared cause reaches, each with one chain that shows it."""
    ops = operations()
    # (module, function) pairs whose callers must declare, with the chain that made them so
    owed: dict[ast.FunctionDef | ast.AsyncFunctionDef, tuple[_Module, tuple[str, ...], str]] = {}
    queue: deque[ast.FunctionDef | ast.AsyncFunctionDef] = deque()
    # how many functions (or methods) have each name: a reference to a shared name is followed
    # only where it cannot mean another (a method's `self.name` in its class, a function in its module)
    defs: Counter[tuple[str, bool]] = Counter()
    for module in mods:
        for node in module.nodes:
            if isinstance(node, FUNCTIONS):
                defs[(node.name, module.is_method(node))] += 1
    found: list[Undeclared] = []
    for module in mods:
        for node in module.nodes:
            if not _is_call(module, node, ops) or _declared_at(module, node):
                continue
            fn = module.function_of(node)
            where = module.label(fn, node) + f" ({_call_name(node)})"
            if fn is None:
                found.append(Undeclared(where, ()))
            elif fn not in owed:
                owed[fn] = (module, (), where)
                queue.append(fn)
    references, common = _references(mods)
    while queue:
        fn = queue.popleft()
        module, chain, where = owed[fn]
        refs = [
            (m, r)
            for m, r in references.get((fn.name, module.is_method(fn)), [])
            if ((m, r) not in common or m is module)
            and (defs[(fn.name, module.is_method(fn))] == 1 or _same_owner(module, fn, m, r))
        ]
        if not refs:
            found.append(Undeclared(where, (*chain, module.label(fn, fn))))
            continue
        for ref_module, ref in refs:
            if _declared_at(ref_module, ref):
                continue
            caller = ref_module.function_of(ref)
            link = ref_module.label(caller, ref)
            if caller is None:
                found.append(Undeclared(where, (*chain, module.label(fn, fn), link)))
            elif caller not in owed:
                owed[caller] = (ref_module, (*chain, module.label(fn, fn)), where)
                queue.append(caller)
    return sorted(set(found), key=lambda u: (u.where, u.chain))


def _references(
    mods: list[_Module],
) -> tuple[dict[tuple[str, bool], list[tuple[_Module, ast.AST]]], set[tuple[_Module, ast.AST]]]:
    """(name, whether a method) -> where it is called or handed on: a function by its name in the
    module that defines or imports it, or as a module's attribute; a method as an attribute of
    an object. Where a builtin type has a method of that name (`.items()`, `.write()`), the
    reference is `common`: it counts only in a module that imports the method's. A function
    left with no reference is reported, never passed."""
    found: dict[tuple[str, bool], list[tuple[_Module, ast.AST]]] = {}
    common: set[tuple[_Module, ast.AST]] = set()
    for module in mods:
        for node in module.nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id in module.defined or node.id in module.names_from:
                    found.setdefault((node.id, False), []).append((module, node))
            elif isinstance(node, ast.Attribute) and _used(module, node):
                base = node.value
                if isinstance(base, ast.Name) and base.id in module.imported:
                    found.setdefault((node.attr, False), []).append((module, node))
                elif node.attr not in _builtin_methods() or (isinstance(base, ast.Name) and base.id == "self"):
                    found.setdefault((node.attr, True), []).append((module, node))
                else:
                    found.setdefault((node.attr, True), []).append((module, node))
                    common.add((module, node))
    return found, common


@cache
def _builtin_methods() -> frozenset[str]:
    kinds: tuple[type, ...] = (dict, list, set, str, bytes, bytearray, tuple, frozenset, io.BytesIO, io.TextIOWrapper)
    return frozenset(name for kind in kinds for name in dir(kind) if not name.startswith("_"))


def _same_owner(module: _Module, fn: ast.AST, ref_module: _Module, ref: ast.AST) -> bool:
    """Whether `ref` can only mean `fn`: `self.name` in fn's own class, or a bare name in fn's module."""
    if ref_module is not module:
        return False
    if isinstance(ref, ast.Name):
        return not module.is_method(fn)
    owner = module.parent.get(fn)
    at: ast.AST = ref
    while at in module.parent and not isinstance(at, ast.ClassDef):
        at = module.parent[at]
    return (
        at is owner
        and isinstance(ref, ast.Attribute)
        and isinstance(ref.value, ast.Name)
        and ref.value.id in ("self", "cls")
    )


def _call_name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id
    return "?"
