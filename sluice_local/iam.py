"""IAM in the local cloud: each function runs as a role that holds exactly its synthesized statements.

The statements come from `sluice_local/policies.json`, a snapshot of the dev stack's IAM policies with
CloudFormation's intrinsics resolved to the local cloud's names (synthesis takes about a minute,
too long for every `sluice run`). `python -m sluice_local.iam` rewrites it from a fresh synthesis, and
tests/infra/test_local_policies.py fails while it differs from the synthesized template.

moto authorizes requests like IAM once authentication is on: it checks each request's signature,
then the caller's policies. As checked on moto 5.2.5, it matches the action exactly for every
service, but the resource only for S3; for every other service it matches the statement's
resources against "*". So locally:
- S3 statements keep their resources, mapped onto the local bucket: a step that writes outside
  its prefixes is denied, as on AWS;
- every other statement keeps its actions exactly and says "*" for its resources: a missing
  action is denied, as on AWS, but a grant on the wrong table or secret is not caught here (the
  infra tests check those ARNs against the template).
moto evaluates no condition but StringEquals, so the ListBucket prefix condition holds as if met.

With authentication on, every request needs credentials that moto knows. The local cloud's own
calls (uploads, starting and watching executions, reading outputs, the CLI) use an IAM user with
an allow-all policy; each function gets the credentials of `sts:AssumeRole` on its own role; the
state machine's role reads the Map's manifest.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import botocore.session
from moto.core.authorization import enable_iam_authentication
from sluice.contract import BEDROCK_PROVIDER

from sluice_local.cloud_names import ACCOUNT, PREFIX, REGION, function_arn, function_name

POLICIES = Path(__file__).with_name("policies.json")
# The stack the snapshot is taken from: the environment a developer deploys and `sluice run` stands in for.
SNAPSHOT_ENV = "dev"
# the first part of a cross-region inference profile's id (`us.anthropic...`)
_PROFILE_PREFIXES = frozenset({"us", "eu", "apac", "us-gov", "global"})
# an environment's settings that belong to its provider family, left out when the snapshot
# synthesizes the environment as another family's
FAMILY_SETTINGS = ("provider", "provider_base_url", "default_model", "batch_queue_tokens", "api_key_secret_arn")
# The state machine's own role, next to the functions' roles in the snapshot.
WORKFLOW = "workflow"
WEBHOOK = "webhook"
# The role Bedrock batch inference jobs run as, next to the functions' roles in the snapshot.
BEDROCK_BATCH = "bedrock_batch"
BEDROCK_SERVICE = "bedrock.amazonaws.com"

Statement = dict[str, Any]
Policies = dict[str, list[Statement]]


@dataclass(frozen=True)
class LocalNames:
    """What the local cloud calls the stack's resources."""

    bucket: str = f"{PREFIX}-bucket"
    table: str = f"{PREFIX}-jobs"
    state_machine: str = f"{PREFIX}-jobs"
    api_key_secret: str = f"{PREFIX}/provider-api-key"
    webhook_secret: str = f"{PREFIX}/webhook-signing-secret"

    def arn(self, service: str, resource: str) -> str:
        return f"arn:aws:{service}:{REGION}:{ACCOUNT}:{resource}"


def _step_of(handler: str) -> str | None:
    """`sluice_handlers.run_shard.handler` -> `run_shard`; None for CDK's own functions."""
    match = re.fullmatch(r"sluice_handlers\.(\w+)\.handler", handler)
    return match.group(1) if match else None


# the guid at the end of a stack id, whose last group names the stack's retained resources
LOCAL_STACK_GUID = "00000000-0000-0000-0000-000000000000"


class _Resolver:
    """Resolves the intrinsics of a policy statement to the local cloud's names and ARNs."""

    PSEUDO = {
        "AWS::Partition": "aws",
        "AWS::Region": REGION,
        "AWS::AccountId": ACCOUNT,
        "AWS::URLSuffix": "amazonaws.com",
        "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{PREFIX}/{LOCAL_STACK_GUID}",
    }

    def __init__(self, resources: dict[str, Any], names: LocalNames) -> None:
        self.refs: dict[str, str] = {}
        self.arns: dict[str, str] = {}
        self.attrs: dict[tuple[str, str], str] = {}
        self.literals: dict[str, str] = {}
        variables: dict[str, Any] = {}
        for logical, resource in resources.items():
            props = resource.get("Properties", {})
            if resource["Type"] == "AWS::Lambda::Function" and (step := _step_of(props.get("Handler", ""))):
                name = function_name(step)
                self.refs[logical] = name
                self.arns[logical] = function_arn(step)
                log_group = props.get("LoggingConfig", {}).get("LogGroup", {}).get("Ref")
                if log_group:
                    self.refs[log_group] = f"/aws/lambda/{name}"
                    self.arns[log_group] = names.arn("logs", f"log-group:/aws/lambda/{name}:*")
                variables.update(props.get("Environment", {}).get("Variables", {}))
            elif _bedrock_role(resource):
                self.arns[logical] = service_role_arn()
            elif resource["Type"] == "AWS::StepFunctions::StateMachine":
                self.refs[logical] = names.arn("states", f"stateMachine:{names.state_machine}")
                self.attrs[(logical, "Name")] = names.state_machine
                # an explicit name reaches the grants as text (or the same intrinsic), not as a reference
                if isinstance(fixed := self(props.get("StateMachineName")), str):
                    for kind in ("stateMachine", "execution"):
                        self.literals[f":{kind}:{fixed}"] = f":{kind}:{names.state_machine}"
        for variable, ref, arn in (
            ("SLUICE_BUCKET", names.bucket, f"arn:aws:s3:::{names.bucket}"),
            ("SLUICE_TABLE", names.table, names.arn("dynamodb", f"table/{names.table}")),
            ("SLUICE_API_KEY_SECRET_ARN", names.arn("secretsmanager", f"secret:{names.api_key_secret}"), ""),
            ("SLUICE_WEBHOOK_SECRET_ARN", names.arn("secretsmanager", f"secret:{names.webhook_secret}"), ""),
        ):
            value = variables.get(variable)
            if isinstance(value, dict) and "Ref" in value:
                self.refs[value["Ref"]] = ref
                self.arns[value["Ref"]] = arn or ref
        self.types = {logical: resource["Type"] for logical, resource in resources.items()}

    def _unknown(self, logical: str) -> str:
        # Resources the local cloud does not create: named after the template, still readable.
        service = self.types.get(logical, "AWS::Unknown::Resource").split("::")[1].lower()
        return self.arns.get(logical) or f"arn:aws:{service}:{REGION}:{ACCOUNT}:{PREFIX}-{logical}"

    def __call__(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, str):
            for text, local in self.literals.items():
                value = value.replace(text, local)
            return value
        if not isinstance(value, dict):
            return value
        if set(value) == {"Ref"}:
            ref = value["Ref"]
            return self.PSEUDO.get(ref) or self.refs.get(ref) or self._unknown(ref)
        if set(value) == {"Fn::GetAtt"}:
            logical, attribute = value["Fn::GetAtt"]
            if attribute == "Arn":
                return self.arns.get(logical) or self._unknown(logical)
            return self.attrs.get((logical, attribute)) or f"{PREFIX}-{logical}.{attribute}"
        if set(value) == {"Fn::Join"}:
            separator, parts = value["Fn::Join"]
            return self(separator.join(str(self(part)) for part in parts))
        if set(value) == {"Fn::Split"}:
            separator, text = value["Fn::Split"]
            return str(self(text)).split(separator)
        if set(value) == {"Fn::Select"}:
            index, items = value["Fn::Select"]
            return self(items)[int(index)]
        if set(value) == {"Fn::Sub"} and isinstance(value["Fn::Sub"], str):
            return re.sub(
                r"\$\{([^}.]+)(?:\.(\w+))?\}",
                lambda m: str(self({"Fn::GetAtt": [m[1], m[2]]} if m[2] else {"Ref": m[1]})),
                value["Fn::Sub"],
            )
        return {key: self(v) for key, v in value.items()}


def _bedrock_role(resource: dict[str, Any]) -> bool:
    """Whether a resource is the role Bedrock's batch inference jobs assume."""
    if resource["Type"] != "AWS::IAM::Role":
        return False
    trust = resource["Properties"].get("AssumeRolePolicyDocument", {}).get("Statement", [])
    return any(BEDROCK_SERVICE in _as_list(s.get("Principal", {}).get("Service", [])) for s in trust)


def service_role_arn() -> str:
    """The local ARN of the role Bedrock batch inference jobs run as."""
    return f"arn:aws:iam::{ACCOUNT}:role/{_role_name(BEDROCK_BATCH)}"


def allows(statements: list[Statement], action: str, resource: str, context: dict[str, str] | None = None) -> bool:
    """Whether the statements allow `action` on `resource`, for a service moto does not emulate
    (Bedrock's batch jobs, `sluice_local.cloud.bedrock_jobs`): actions and resources as IAM matches them,
    and StringEquals and StringLike conditions on `context`; the statements hold no Deny."""
    for statement in statements:
        if statement.get("Effect") != "Allow":
            continue
        if not any(fnmatch.fnmatchcase(action, a) for a in _as_list(statement.get("Action", []))):
            continue
        if not any(fnmatch.fnmatchcase(resource, r) for r in _as_list(statement.get("Resource", []))):
            continue
        conditions = statement.get("Condition", {})
        equals, like = conditions.get("StringEquals", {}), conditions.get("StringLike", {})
        if all((context or {}).get(key) == value for key, value in equals.items()) and all(
            any(fnmatch.fnmatchcase((context or {}).get(key, ""), p) for p in _as_list(patterns))
            for key, patterns in like.items()
        ):
            return True
    return False


def policies_from_template(template: dict[str, Any], names: LocalNames | None = None) -> Policies:
    """Per function (by step name, and `webhook`) and for the state machine (`workflow`): the
    statements of every IAM policy on its role, in the template's order, resolved to local names."""
    resources: dict[str, Any] = template["Resources"]
    resolve = _Resolver(resources, names or LocalNames())
    owner: dict[str, str] = {}
    for resource in resources.values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::Lambda::Function" and (step := _step_of(props.get("Handler", ""))):
            owner[props["Role"]["Fn::GetAtt"][0]] = step
        elif resource["Type"] == "AWS::StepFunctions::StateMachine":
            owner[props["RoleArn"]["Fn::GetAtt"][0]] = WORKFLOW
    owner.update({logical: BEDROCK_BATCH for logical, resource in resources.items() if _bedrock_role(resource)})
    policies: Policies = {name: [] for name in owner.values()}
    for role, name in owner.items():
        props = resources[role]["Properties"]
        if props.get("ManagedPolicyArns"):
            raise ValueError(f"the {name} role has managed policies, which the local cloud cannot read")
        for inline in props.get("Policies", []):
            policies[name].extend(resolve(inline["PolicyDocument"]["Statement"]))
    for resource in resources.values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        for role in resource["Properties"].get("Roles", []):
            if role.get("Ref") in owner:
                policies[owner[role["Ref"]]].extend(resolve(resource["Properties"]["PolicyDocument"]["Statement"]))
    return {name: policies[name] for name in sorted(policies)}


def load_policies(path: Path = POLICIES) -> Policies:
    policies: Policies = json.loads(path.read_text())
    return policies


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def moto_statements(statements: list[Statement], *, bucket: str, names: LocalNames | None = None) -> list[Statement]:
    """The statements as moto can enforce them (see the module's docstring): S3 resources on the
    local bucket, "*" for every other service's resources; one statement per service."""
    snapshot_bucket = f"arn:aws:s3:::{(names or LocalNames()).bucket}"
    local_bucket = f"arn:aws:s3:::{bucket}"
    enforced: list[Statement] = []
    for statement in statements:
        if "NotAction" in statement or "NotResource" in statement:
            raise ValueError(f"the local cloud does not model NotAction or NotResource: {statement}")
        by_service: dict[str, list[str]] = {}
        for action in _as_list(statement["Action"]):
            by_service.setdefault(action.split(":")[0], []).append(action)
        for service, actions in by_service.items():
            local: Statement = {"Effect": statement["Effect"], "Action": actions}
            if service == "s3":
                resources = [
                    local_bucket + r.removeprefix(snapshot_bucket) if r.startswith(snapshot_bucket) else r
                    for r in _as_list(statement["Resource"])
                ]
                local["Resource"] = resources
            else:
                local["Resource"] = "*"
            if "Condition" in statement:
                local["Condition"] = statement["Condition"]
            enforced.append(local)
    return enforced


@functools.cache
def _fresh() -> botocore.session.Session:
    return botocore.session.get_session()


def core_session() -> botocore.session.Session:
    """A botocore session that shares a first session's service models and starts with a copy of
    its event handlers. A fresh session would parse the models again and register botocore's
    builtin handlers one by one (a second or more on a busy machine), and a local cloud starts a
    session per role; in Lambda each container does that once. A client copies its session's
    handlers the same way."""
    core = botocore.session.Session(event_hooks=copy.copy(_fresh()._original_handler), include_builtin_handlers=False)
    core.register_component("data_loader", _fresh().get_component("data_loader"))
    return core


def default_session() -> boto3.Session:
    """What `boto3.client` uses while the local cloud runs (moto empties boto3's default): the
    environment's credentials, read when a client is made, over a shared core (`core_session`)."""
    return boto3.Session(botocore_session=core_session())


def _role_name(name: str) -> str:
    return f"{PREFIX}-{name.replace('_', '-')}"


@dataclass
class LocalIam:
    """The identities of a local cloud: an admin for the cloud's own calls, a session per function."""

    admin_key_id: str
    admin_secret: str
    sessions: dict[str, boto3.Session] = field(default_factory=dict)
    workflow: boto3.Session | None = None
    # the role Bedrock batch inference jobs run as, for the local cloud's emulation of them
    bedrock_batch: boto3.Session | None = None
    # whose role each function's access key is (its name in the snapshot), for requests signed
    # outside moto: Bedrock's runtime, which the simulator answers
    key_owners: dict[str, str] = field(default_factory=dict)

    def may_invoke(self, policies: Policies, key: str, region: str, model: str) -> str | None:
        """None when the role that signed with `key` may bedrock:InvokeModel `model` (a foundation
        model, or an inference profile of the account), else the AccessDenied message."""
        action = "bedrock:InvokeModel"
        head = model.split(".", 1)[0]
        kind = "inference-profile" if head in _PROFILE_PREFIXES else "foundation-model"
        account = ACCOUNT if kind == "inference-profile" else ""
        # a model named by its ARN (an application inference profile's) is that resource
        resource = model if model.startswith("arn:") else f"arn:aws:bedrock:{region}:{account}:{kind}/{model}"
        owner = self.key_owners.get(key)
        if owner is not None and allows(policies.get(owner, []), action, resource):
            return None
        who = _role_name(owner) if owner else "an unknown caller"
        return f"User: {who} is not authorized to perform: {action} on resource: {resource}"

    def session_for(self, function_name: str) -> boto3.Session:
        try:
            return self.sessions[function_name]
        except KeyError:
            raise PermissionError(f"no role for the function {function_name}: not in {POLICIES.name}") from None

    def admin_environment(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.admin_key_id, "AWS_SECRET_ACCESS_KEY": self.admin_secret}


def provision(policies: Policies, *, bucket: str) -> LocalIam:
    """Creates the admin user and one role per function with its statements, and assumes each.
    Call it in moto before authentication is on."""
    iam = boto3.client("iam", region_name=REGION)
    sts = boto3.client("sts", region_name=REGION)
    admin = f"{PREFIX}-admin"
    iam.create_user(UserName=admin)
    everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName=admin, PolicyName="admin", PolicyDocument=json.dumps(everything))
    key = iam.create_access_key(UserName=admin)["AccessKey"]
    local = LocalIam(admin_key_id=key["AccessKeyId"], admin_secret=key["SecretAccessKey"])
    for name, statements in policies.items():
        service = {WORKFLOW: "states", BEDROCK_BATCH: "bedrock"}.get(name, "lambda")
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": f"{service}.amazonaws.com"}, "Action": "sts:AssumeRole"}
            ],
        }
        role = iam.create_role(RoleName=_role_name(name), AssumeRolePolicyDocument=json.dumps(trust))["Role"]
        if statements:
            document = {"Version": "2012-10-17", "Statement": moto_statements(statements, bucket=bucket)}
            iam.put_role_policy(RoleName=role["RoleName"], PolicyName="grants", PolicyDocument=json.dumps(document))
        credentials = sts.assume_role(RoleArn=role["Arn"], RoleSessionName=name)["Credentials"]
        core = core_session()
        # Flexible checksums guard bytes crossing a network; this S3 is in the same process, where
        # encoding each body as aws-chunked with a CRC32 and moto decoding it again cost ~40% of
        # every large PUT (the shards' parts, the cache's segments, Merge's parts) and guard nothing.
        # Deployed functions keep botocore's default.
        core.set_config_variable("request_checksum_calculation", "when_required")
        session = boto3.Session(
            aws_access_key_id=credentials["AccessKeyId"],
            aws_secret_access_key=credentials["SecretAccessKey"],
            aws_session_token=credentials["SessionToken"],
            region_name=REGION,
            botocore_session=core,
        )
        local.key_owners[credentials["AccessKeyId"]] = name
        if name == WORKFLOW:
            local.workflow = session
        elif name == BEDROCK_BATCH:
            local.bedrock_batch = session
        else:
            local.sessions[function_name(name)] = session
    return local


@contextmanager
def enforced(policies: Policies, *, bucket: str) -> Iterator[LocalIam]:
    """IAM on, inside `mock_aws`, once the cloud's resources exist: the environment's credentials
    become the admin's, each function's session its role's (`sluice_handlers.runtime.use_sessions`)."""
    from sluice_handlers.runtime import use_sessions

    local = provision(policies, bucket=bucket)
    assert local.workflow is not None, f"no {WORKFLOW} role in {POLICIES.name}"
    with (
        mock.patch.dict("os.environ", local.admin_environment()),
        # the default session read the credentials before; this one reads the admin's
        mock.patch("boto3.DEFAULT_SESSION", default_session()),
        enable_iam_authentication(),
    ):
        use_sessions(local.session_for)
        try:
            yield local
        finally:
            use_sessions(None)


def synthesized_template(env: str = SNAPSHOT_ENV, *, provider: str | None = None) -> dict[str, Any]:
    """The CloudFormation template of one environment's stack, as `cdk synth` writes it; with
    `provider`, of the same environment sending to that provider family instead."""
    import os
    import tempfile

    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    import aws_cdk as cdk

    from infra.config import cdk_json_context
    from infra.stack import build_app

    context = cdk_json_context()
    if provider is not None:
        chosen = {k: v for k, v in context["environments"][env].items() if k not in FAMILY_SETTINGS}
        context["environments"] = {**context["environments"], env: {**chosen, "provider": provider}}
    with tempfile.TemporaryDirectory() as outdir:
        app = cdk.App(context={**context, "aws:cdk:bundling-stacks": []}, outdir=outdir)
        stack = build_app(app, [env])[env]
        app.synth()
        template: dict[str, Any] = json.loads((Path(outdir) / f"{stack.stack_name}.template.json").read_text())
    return template


def merged(*snapshots: Policies) -> Policies:
    """Each role's statements in any of `snapshots`, each once, in the order first met."""
    roles: Policies = {}
    for snapshot in snapshots:
        for role, statements in snapshot.items():
            kept = roles.setdefault(role, [])
            kept.extend(s for s in statements if s not in kept)
    return {role: roles[role] for role in sorted(roles)}


def snapshot() -> Policies:
    """The statements the local cloud enforces: the dev stack's, and those it has only when its
    provider is Bedrock (a local run may name any family; the grants are the stack's either way)."""
    return merged(
        policies_from_template(synthesized_template()),
        policies_from_template(synthesized_template(provider=BEDROCK_PROVIDER)),
    )


def main() -> None:
    """Rewrites sluice_local/policies.json from a fresh synthesis of the dev stack."""
    POLICIES.write_text(json.dumps(snapshot(), indent=2) + "\n")
    print(f"wrote {POLICIES}")


if __name__ == "__main__":
    main()
