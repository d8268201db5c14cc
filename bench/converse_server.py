"""A small Converse-compatible server on 127.0.0.1, independent of Sluice: it imports
nothing of `sluice` or `local`, and answers `POST /model/{modelId}/converse` in Amazon Bedrock's
Converse shape (output.message.content[].text, stopReason, usage.inputTokens/outputTokens/
totalTokens, metrics.latencyMs) with its own words, so a run's results show whose answers they are.

It takes only SigV4-signed requests (an `Authorization: AWS4-HMAC-SHA256 Credential=...` header,
service `bedrock`), as Bedrock does, and records the access key id each was signed with. Given the
secret of a key (`--secret KEY=SECRET`), it checks the signature as AWS would: it recomputes it with
botocore from the request as it arrived on the wire (the path, the signed headers, the body) and
answers 403 SignatureDoesNotMatch when it differs. It also checks each body against AWS's own model of
Converse (botocore's bedrock-runtime service model) and answers 400 ValidationException, as Bedrock
does, on a body that model rejects. Neither check is Sluice's code.

    .venv/bin/python bench/converse_server.py --port 8765
    AWS_ENDPOINT_URL_BEDROCK_RUNTIME=http://127.0.0.1:8765 AWS_ACCESS_KEY_ID=AKIDEXAMPLE \\
      AWS_SECRET_ACCESS_KEY=secret .venv/bin/sluice run examples/reviews.jsonl --provider bedrock \\
      --model anthropic.claude-3-haiku-20240307-v1:0 --out out
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.session import get_session
from botocore.validate import ParamValidator

ANSWER_PREFIX = "converse-server answers: "
_CREDENTIAL = re.compile(r"Credential=([^/]+)/\d{8}/([^/]+)/([^/]+)/aws4_request")
_SIGNED = re.compile(r"SignedHeaders=([^,\s]+)")
_SIGNATURE = re.compile(r"Signature=([0-9a-f]+)")


def _converse_input() -> Any:
    return get_session().get_service_model("bedrock-runtime").operation_model("Converse").input_shape


def signature_as_aws_computes(request: web.Request, body: bytes, secret: str, region: str) -> str:
    """The signature AWS would compute for this request as it arrived, from the headers it says it signed."""
    authorization = request.headers["Authorization"]
    signed = _SIGNED.search(authorization)
    names = signed.group(1).split(";") if signed else []
    headers = {name: request.headers.get(name, "") for name in names}
    url = f"{request.scheme}://{request.host}{request.raw_path}"
    wire = AWSRequest(method=request.method, url=url, data=body, headers=headers)
    auth = SigV4Auth(Credentials(_CREDENTIAL.search(authorization).group(1), secret), "bedrock", region)  # type: ignore[union-attr]
    wire.context["timestamp"] = request.headers.get("X-Amz-Date", "")
    canonical = auth.canonical_request(wire)
    return str(auth.signature(auth.string_to_sign(wire, canonical), wire))


@dataclass
class ConverseServer:
    requests: int = 0
    models: Counter[str] = field(default_factory=Counter)
    access_keys: Counter[str] = field(default_factory=Counter)
    regions: Counter[str] = field(default_factory=Counter)
    base_url: str = ""
    # access key id -> secret: requests signed by these keys have their signatures checked
    secrets: dict[str, str] = field(default_factory=dict)
    verified: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    _runner: web.AppRunner | None = None
    _shape: Any = field(default_factory=_converse_input)

    async def converse(self, request: web.Request) -> web.Response:
        signed = _CREDENTIAL.search(request.headers.get("Authorization", ""))
        if signed is None or signed.group(3) != "bedrock":
            self.refused["unsigned"] += 1
            return web.json_response({"message": "Missing Authentication Token"}, status=403)
        raw = await request.read()
        secret = self.secrets.get(signed.group(1))
        if secret is not None:
            claimed = _SIGNATURE.search(request.headers["Authorization"])
            if claimed is None or claimed.group(1) != signature_as_aws_computes(request, raw, secret, signed.group(2)):
                self.refused["signature"] += 1
                return web.json_response(
                    {"message": "The request signature we calculated does not match the signature you provided."},
                    status=403,
                    headers={"x-amzn-ErrorType": "InvalidSignatureException"},
                )
            self.verified += 1
        body: dict[str, Any] = json.loads(raw)
        report = ParamValidator().validate({**body, "modelId": request.match_info["model"]}, self._shape)
        if report.has_errors():
            self.refused["validation"] += 1
            return web.json_response(
                {"message": report.generate_report()}, status=400, headers={"x-amzn-ErrorType": "ValidationException"}
            )
        self.requests += 1
        self.models[request.match_info["model"]] += 1
        self.access_keys[signed.group(1)] += 1
        self.regions[signed.group(2)] += 1
        said = " ".join(
            part.get("text", "")
            for message in body.get("messages", [])
            for part in message.get("content", [])
            if isinstance(part, dict)
        )
        words = len(said.split())
        text = f"{ANSWER_PREFIX}{words} words received"
        return web.json_response(
            {
                "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
                "stopReason": "end_turn",
                "usage": {"inputTokens": words + 3, "outputTokens": 5, "totalTokens": words + 8},
                "metrics": {"latencyMs": 1},
            }
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/model/{model}/converse", self.converse)
        return app

    async def start(self, port: int = 0) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class InThread:
    """The server on a thread of its own, for a test or a bench that runs `sluice run` beside it."""

    def __init__(self, secrets: dict[str, str] | None = None) -> None:
        self.server = ConverseServer(secrets=dict(secrets or {}))
        self._ready = threading.Event()
        self._loop: Any = None
        self._thread = threading.Thread(target=self._serve, name="converse-server", daemon=True)

    def _serve(self) -> None:
        import asyncio

        loop = asyncio.new_event_loop()
        self._loop = loop
        loop.run_until_complete(self.server.start())
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self.server.stop())
        loop.close()

    def __enter__(self) -> ConverseServer:
        self._thread.start()
        self._ready.wait(timeout=30)
        return self.server

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--secret", action="append", default=[], metavar="KEY=SECRET", help="check its signatures")
    args = parser.parse_args()
    server = ConverseServer(secrets=dict(item.split("=", 1) for item in args.secret))
    print(json.dumps({"listening": f"http://127.0.0.1:{args.port}"}), flush=True)
    web.run_app(server.app(), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
