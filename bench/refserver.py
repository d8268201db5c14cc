"""A deliberately small OpenAI-compatible server for client benchmarks (not the simulator).

POST /v1/chat/completions waits `--latency` seconds and answers one fixed chat.completion.
With `--faults`, the first attempt of about 10% of requests gets a 429 (Retry-After: 1) and
of another 5% a 500, both at once (as real providers reject before queueing); which requests
is decided by a hash of the x-sluice-custom-id header or else of the body, so retries succeed
and every client meets the same faults.

It is a bare asyncio.Protocol speaking just enough HTTP/1.1 (keep-alive, Content-Length
bodies) and answers through loop.call_later rather than a task per request: on a 2-core
machine the server shares the box with the client being measured, so it must cost as
little CPU per request as possible or it, not the client, sets the pace.

Prints `PORT <n>` on stdout once it is listening; runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import zlib

ANSWER = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"positive"},'
    b'"logprobs":null,"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}'
)
RATE_LIMITED = (
    b'{"error":{"message":"Rate limit reached (bench fault)","type":"requests","code":"rate_limit_exceeded"}}'
)
SERVER_ERROR = b'{"error":{"message":"The server had an error (bench fault)","type":"server_error"}}'
NOT_FOUND = b'{"error":{"message":"not found","type":"invalid_request_error"}}'


def http(status: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 " + status.encode() + b"\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n"
        b"x-request-id: req_bench\r\n" + extra + b"\r\n" + body
    )


OK_RESPONSE = http("200 OK", ANSWER)
RATE_LIMITED_RESPONSE = http("429 Too Many Requests", RATE_LIMITED, b"Retry-After: 1\r\n")
SERVER_ERROR_RESPONSE = http("500 Internal Server Error", SERVER_ERROR)
NOT_FOUND_RESPONSE = http("404 Not Found", NOT_FOUND)


class Counters:
    def __init__(self) -> None:
        self.requests = 0
        self.r429 = 0
        self.r500 = 0
        self.faulted: set[int] = set()


class BenchProtocol(asyncio.Protocol):
    def __init__(self, latency: float, faults: bool, counters: Counters) -> None:
        self.latency = latency
        self.faults = faults
        self.counters = counters
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buffer[:end]
            length = 0
            lower = head.lower()
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = lower.find(b"\r\n", at + 2)
                length = int(lower[at + 17 : stop if stop >= 0 else len(lower)])
            total = end + 4 + length
            if len(buffer) < total:
                break
            self.handle(head, lower, buffer[end + 4 : total])
            buffer = buffer[total:]
        self.buffer = buffer

    def handle(self, head: bytes, lower: bytes, body: bytes) -> None:
        counters = self.counters
        counters.requests += 1
        if not head.startswith(b"POST /v1/chat/completions "):
            self.send(NOT_FOUND_RESPONSE)
            return
        if self.faults:
            at = lower.find(b"\r\nx-sluice-custom-id:")
            if at >= 0:
                stop = lower.find(b"\r\n", at + 2)
                key = zlib.crc32(head[at + 21 : stop if stop >= 0 else len(head)].strip())
            else:
                key = zlib.crc32(body)
            bucket = key % 100
            if bucket < 15 and key not in counters.faulted:
                counters.faulted.add(key)
                if bucket < 10:
                    counters.r429 += 1
                    self.send(RATE_LIMITED_RESPONSE)
                else:
                    counters.r500 += 1
                    self.send(SERVER_ERROR_RESPONSE)
                return
        if self.latency > 0:
            self.loop.call_later(self.latency, self.send, OK_RESPONSE)
        else:
            self.send(OK_RESPONSE)

    def send(self, payload: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(payload)


async def serve(port: int, latency: float, faults: bool) -> None:
    loop = asyncio.get_running_loop()
    counters = Counters()
    server = await loop.create_server(lambda: BenchProtocol(latency, faults, counters), "127.0.0.1", port, backlog=8192)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--faults", action="store_true")
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        asyncio.run(serve(args.port, args.latency, args.faults))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
