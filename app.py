#!/usr/bin/env python3
"""CDK entry point: `-c env=dev` builds that environment's stack, no `env` builds them all."""

import aws_cdk as cdk

from infra.checks import SecurityChecks
from infra.config import cdk_json_context
from infra.stack import build_app

# cdk.json's context as defaults, so `python app.py` synthesizes what `cdk synth` does; the
# CLI's own context (cdk.json, `-c` flags) still takes precedence.
app = cdk.App(context=cdk_json_context())
build_app(app)
# cdk-nag's AwsSolutions pack: synth fails on a finding nobody acknowledged, and says which
cdk.Validations.of(app).add_plugins(SecurityChecks(app))
app.synth()
