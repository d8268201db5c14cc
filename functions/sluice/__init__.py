"""Sluice core: plain Python that the Lambda handlers and the local runner call."""
