"""The client for a deployed environment: its stack, its jobs (read through JobStore), their
lines, and the uploads that start new ones. The `sluice` commands in sluice_local/cli use it."""

from sluice_local.deployed.stack import Deployment, aws_errors, connect, environment

__all__ = ["Deployment", "aws_errors", "connect", "environment"]
