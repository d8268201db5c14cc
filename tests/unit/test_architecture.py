"""The import rules of docs/architecture.md, read from the source with `ast` (`import_graph`)."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.import_graph import PACKAGES, ROOT, cycles, files, imports, imports_of, module_name, top, within

# Packages the Lambda asset carries without naming them in functions/requirements.txt: boto3's
# botocore, aiohttp's yarl (and the Lambda runtime's own boto3).
ASSET_TRANSITIVE = {"botocore", "yarl", "boto3"}


def asset_packages() -> set[str]:
    """Import names of what functions/requirements.txt puts in the Lambda asset."""
    names = set(ASSET_TRANSITIVE)
    for raw in (ROOT / "functions" / "requirements.txt").read_text().splitlines():
        requirement = raw.split("#", 1)[0].strip()
        if requirement:
            names.add(re.split(r"[=<>!~\[; ]", requirement, maxsplit=1)[0].replace("-", "_").lower())
    return names


def violations(package: str, forbidden: tuple[str, ...], *, only: str | None = None) -> list[str]:
    return [
        f"{where}: {module} imports {imported}"
        for where, module, imported in imports_of(package)
        if (only is None or within(module, only)) and any(within(imported, f) for f in forbidden)
    ]


def foreign_packages(package: str, allowed: set[str], *, exclude: str | None = None) -> list[str]:
    """Imports that are neither the standard library, the project's Lambda code, nor `allowed`."""
    own = {"sluice", "sluice_handlers"}
    return [
        f"{where}: {module} imports {imported}"
        for where, module, imported in imports_of(package)
        if (exclude is None or not within(module, exclude))
        and top(imported) not in sys.stdlib_module_names
        and top(imported) not in own
        and top(imported) not in allowed
    ]


def test_the_contract_imports_only_the_standard_library() -> None:
    paths = sorted((PACKAGES["sluice"] / "contract").glob("*.py"))
    assert paths, "no sluice.contract package: these rules check nothing"
    outside = [
        f"{path.name}:{line}: {name}"
        for path in paths
        for line, name in imports(path.read_text(), module_name(path), is_package=path.name == "__init__.py")
        if top(name) not in sys.stdlib_module_names and not within(name, "sluice.contract")
    ]
    assert not outside, f"sluice.contract must stay standard library only (cdk synth loads it): {outside}"


def test_the_core_imports_no_handler_infra_local_bench_or_test_code() -> None:
    assert not violations("sluice", ("sluice_handlers", "infra", "sluice_local", "bench", "tests"))


def test_the_handlers_import_the_core_but_no_infra_local_bench_or_test_code() -> None:
    assert not violations("sluice_handlers", ("infra", "sluice_local", "bench", "tests"))


def test_the_lambda_code_imports_only_what_its_asset_carries() -> None:
    allowed = asset_packages()
    outside = foreign_packages("sluice", allowed) + foreign_packages("sluice_handlers", allowed)
    assert not outside, f"not in functions/requirements.txt, so missing in Lambda: {outside}"


def test_infra_reads_only_the_contract_of_the_lambda_code() -> None:
    wrong = [
        f"{where}: {module} imports {imported}"
        for where, module, imported in imports_of("infra")
        if (within(imported, "sluice") and not within(imported, "sluice.contract"))
        or any(within(imported, f) for f in ("sluice_handlers", "sluice_local", "bench", "tests"))
    ]
    assert not wrong


def test_local_imports_no_bench_or_test_code() -> None:
    assert not violations("sluice_local", ("bench", "tests"))


def test_the_simulator_knows_nothing_of_sluice() -> None:
    # it plays the provider, and runs alone as `sluice simulator` or `python -m sluice_local.simulator`
    assert not violations(
        "sluice_local", ("sluice", "sluice_handlers", "infra", "sluice_local.cloud"), only="sluice_local.simulator"
    )


def test_the_deployed_stack_client_never_starts_the_local_cloud() -> None:
    forbidden = (
        "sluice_handlers",
        "infra",
        "sluice_local.cloud",
        "sluice_local.iam",
        "sluice_local.moto_patches",
        "sluice_local.moto_quotas",
        "moto",
    )
    assert not violations("sluice_local", forbidden, only="sluice_local.deployed")


# provider SDKs: only `sluice.providers` knows a provider's API (issue 32)
PROVIDER_SDKS = ("openai", "anthropic")


def test_only_the_providers_package_imports_a_provider_sdk() -> None:
    wrong = [
        f"{where}: {module} imports {imported}"
        for package in ("sluice", "sluice_handlers")
        for where, module, imported in imports_of(package)
        if top(imported) in PROVIDER_SDKS and not within(module, "sluice.providers")
    ]
    assert not wrong


def test_bench_is_imported_by_no_product_code() -> None:
    for package in ("sluice", "sluice_handlers", "infra", "sluice_local"):
        assert not violations(package, ("bench",))


# Providers are a seam (issue 32): only `sluice.providers` imports a provider's SDK or builds a client
# of a provider's AWS service, and only it names a field or header of a provider's wire.
PROVIDERS_PACKAGE = "sluice.providers"
PROVIDER_SDKS = ("openai", "anthropic")
PROVIDER_AWS_SERVICES = re.compile(r"bedrock(-.+)?")
# OpenAI's headers, usage fields and answer shape, as they appear in code that reads them
OPENAI_WIRE_NAMES = re.compile(
    r"x-ratelimit-|Bearer |prompt_tokens|completion_tokens|input_tokens|output_tokens"
    r"|[\"'](?:max_tokens|total_tokens|usage|choices|finish_reason|x-request-id)[\"']"
)
# Anthropic's headers and answer fields, likewise
ANTHROPIC_WIRE_NAMES = re.compile(
    r"anthropic-ratelimit-|anthropic-version|x-api-key|stop_reason|stop_sequences|cache_read_input_tokens"
    r"|[\"'](?:request-id|overloaded_error|end_turn)[\"']"
)


def provider_clients(source: str) -> Iterator[tuple[int, str]]:
    """(line, service) of each `<x>.client("bedrock...")` or `.resource(...)` call: a provider's
    AWS service, by its name string."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name not in ("client", "resource"):
            continue
        named = [node.args[0]] if node.args else []
        named += [k.value for k in node.keywords if k.arg == "service_name"]
        for arg in named:
            if (
                isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and PROVIDER_AWS_SERVICES.fullmatch(arg.value)
            ):
                yield node.lineno, arg.value


def provider_sdk_users(package: str) -> dict[str, list[str]]:
    """Files of `package` outside `sluice.providers` that import a provider SDK or build a client of a
    provider's AWS service, with what each does where."""
    found: dict[str, list[str]] = {}
    for where, module, imported in imports_of(package):
        if not within(module, PROVIDERS_PACKAGE) and any(within(imported, sdk) for sdk in PROVIDER_SDKS):
            found.setdefault(where.rsplit(":", 1)[0], []).append(f"{where}: imports {imported}")
    for path in files(package):
        if within(module_name(path), PROVIDERS_PACKAGE):
            continue
        shown = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
        for line, service in provider_clients(path.read_text()):
            found.setdefault(shown, []).append(f"{shown}:{line}: a {service} client")
    return found


def test_only_the_providers_package_speaks_to_a_provider_through_its_sdk() -> None:
    outside = {
        path: uses
        for package in ("sluice", "sluice_handlers", "infra", "sluice_local")
        for path, uses in provider_sdk_users(package).items()
    }
    assert not outside, f"a provider's SDK or AWS client outside sluice.providers: {outside}"


def test_no_lambda_code_outside_the_providers_names_a_providers_wire() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for package in ("sluice", "sluice_handlers")
        for path in files(package)
        if not within(module_name(path), PROVIDERS_PACKAGE)
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if OPENAI_WIRE_NAMES.search(line) or ANTHROPIC_WIRE_NAMES.search(line)
    ]
    assert not hits, "A provider's wire names belong in its package of sluice.providers:\n" + "\n".join(hits)


def test_the_seam_rules_catch_a_provider_sdk_client_or_wire_name_outside_the_providers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "sluice"
    (fake / "providers" / "openai").mkdir(parents=True)
    (fake / "providers" / "openai" / "batch.py").write_text("import openai\nBEARER = 'Bearer '\n")
    (fake / "sdk.py").write_text("def late():\n    from anthropic import AsyncAnthropic\n")
    (fake / "aws.py").write_text("import boto3\nrt = boto3.client('bedrock-runtime')\ns3 = boto3.client('s3')\n")
    (fake / "wire.py").write_text("def used(body):\n    return body['usage']['prompt_tokens']\n")
    monkeypatch.setitem(PACKAGES, "sluice", fake)
    assert provider_sdk_users("sluice") == {
        f"{fake}/aws.py": [f"{fake}/aws.py:2: a bedrock-runtime client"],
        f"{fake}/sdk.py": [f"{fake}/sdk.py:2: imports anthropic.AsyncAnthropic"],
    }
    wire = [p.name for p in files("sluice") if not within(module_name(p), PROVIDERS_PACKAGE)]
    assert [name for name in wire if any(map(OPENAI_WIRE_NAMES.search, (fake / name).read_text().splitlines()))] == [
        "wire.py"
    ]


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("from sluice_handlers.runtime import runtime\n", "sluice.merge", "sluice_handlers.runtime.runtime"),
        ("def f():\n    import infra.stack\n", "sluice.plan", "infra.stack"),
        ("from .. import local\n", "sluice.sub.mod", "sluice.local"),
        ("from . import parts\n", "sluice.direct", "sluice.parts"),
        ("from .model import Outcome\n", "sluice", "sluice.model.Outcome"),
        ("from sluice_local import simulator as sim\n", "sluice_local.cli.simulator", "sluice_local.simulator"),
    ],
)
def test_the_import_reader_resolves_what_a_module_imports(source: str, module: str, expected: str) -> None:
    is_package = module == "sluice"
    assert expected in [name for _, name in imports(source, module, is_package=is_package)]


def test_the_rules_catch_a_core_module_importing_a_layer_above(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "sluice"
    fake.mkdir()
    (fake / "clean.py").write_text("from .contract import STEPS\nimport orjson\n")
    (fake / "leaky.py").write_text("def late():\n    from sluice_local.cloud import LocalCloud\n")
    monkeypatch.setitem(PACKAGES, "sluice", fake)
    assert violations("sluice", ("sluice_handlers", "infra", "sluice_local")) == [
        f"{fake}/leaky.py:2: sluice.leaky imports sluice_local.cloud.LocalCloud"
    ]


def test_the_rules_catch_a_third_party_import_the_asset_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "sluice_handlers"
    fake.mkdir()
    (fake / "plan.py").write_text("import orjson\nimport boto3\nfrom sluice.plan import plan_job\nimport moto\n")
    monkeypatch.setitem(PACKAGES, "sluice_handlers", fake)
    assert foreign_packages("sluice_handlers", asset_packages()) == [
        f"{fake}/plan.py:4: sluice_handlers.plan imports moto"
    ]


# The core's packages, in the pipeline's order: each may import the ones its docstring names, which
# are all below it, so the packages form no cycle (docs/architecture.md, The core's packages).
BELOW_PROVIDERS = {"contract", "core"}
LAYERS: dict[str, set[str]] = {
    "contract": set(),
    "core": {"contract"},
    "providers": BELOW_PROVIDERS,
    "formats": BELOW_PROVIDERS | {"providers"},
    "store": BELOW_PROVIDERS,
    "cache": BELOW_PROVIDERS | {"providers"},
    "limits": BELOW_PROVIDERS | {"providers", "store"},
    "send": BELOW_PROVIDERS | {"providers", "formats", "limits", "store"},
    "shard": BELOW_PROVIDERS | {"providers", "formats", "store", "limits", "send", "cache"},
    "plan": BELOW_PROVIDERS | {"providers", "formats", "store", "limits", "send", "cache", "shard"},
    "merge": BELOW_PROVIDERS | {"providers", "formats", "store", "limits", "send", "cache", "shard", "plan"},
    "runners.batch": BELOW_PROVIDERS | {"providers", "formats", "store", "limits", "send", "cache", "shard"},
    "runners": BELOW_PROVIDERS
    | {"providers", "formats", "store", "limits", "send", "cache", "shard", "plan", "merge", "runners.batch"},
}


def core_package(module: str) -> str | None:
    """The package of `LAYERS` a module of `sluice` belongs to (None for `sluice` itself)."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "sluice":
        return None
    if parts[1] == "runners" and len(parts) > 2 and parts[2] == "batch":
        return "runners.batch"
    return parts[1] if parts[1] in LAYERS else None


def package_imports() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> where, for every import between two of the core's packages."""
    found: dict[tuple[str, str], list[str]] = {}
    for where, module, imported in imports_of("sluice"):
        source, target = core_package(module), core_package(imported)
        if source and target and source != target:
            found.setdefault((source, target), []).append(f"{where}: {module} imports {imported}")
    return found


def layer_violations() -> list[str]:
    return [
        where
        for (source, target), wheres in sorted(package_imports().items())
        if target not in LAYERS[source]
        for where in wheres
    ]


def test_every_module_of_the_core_is_in_one_of_its_packages() -> None:
    loose = [
        str(path.relative_to(ROOT))
        for path in files("sluice")
        if module_name(path) != "sluice" and core_package(module_name(path)) is None
    ]
    assert not loose, f"a module outside the core's packages (add it to one, or a package to LAYERS): {loose}"
    packages = {p.name for p in PACKAGES["sluice"].iterdir() if (p / "__init__.py").exists()}
    assert packages == {name.split(".")[0] for name in LAYERS}


def test_each_package_of_the_core_imports_only_the_packages_below_it() -> None:
    assert not layer_violations()


def test_the_core_s_packages_import_each_other_in_no_cycle() -> None:
    assert not cycles(set(package_imports()))
    assert not cycles({(source, target) for source, allowed in LAYERS.items() for target in allowed})


def test_each_package_says_what_it_owns_and_what_it_may_import() -> None:
    for name in LAYERS:
        init = PACKAGES["sluice"].joinpath(*name.split("."), "__init__.py")
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert doc, f"{init.relative_to(ROOT)} has no docstring"
        if name not in ("contract", "providers"):
            assert "May import" in doc, f"{init.relative_to(ROOT)} does not say what it may import"


def test_the_package_rules_catch_an_import_upward_and_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "sluice"
    for name in ("store", "shard", "runners/batch"):
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text("")
    (fake / "store" / "jobs.py").write_text("def late():\n    from sluice.shard.frame import ShardContext\n")
    (fake / "shard" / "frame.py").write_text("from sluice.store.jobs import JobStore\n")
    (fake / "runners" / "batch" / "submit.py").write_text("from ...shard import frame\n")
    monkeypatch.setitem(PACKAGES, "sluice", fake)
    assert layer_violations() == [f"{fake}/store/jobs.py:2: sluice.store.jobs imports sluice.shard.frame.ShardContext"]
    assert cycles(set(package_imports())) == [["shard", "store", "shard"]]
    assert ("runners.batch", "shard") in package_imports()
