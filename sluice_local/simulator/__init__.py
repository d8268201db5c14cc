"""A provider simulator (OpenAI-compatible, Anthropic, Bedrock, Gemini) for the demo, the tests and the benchmarks.

Everything it answers is labelled as coming from a simulator (`server: sluice-simulator`,
`system_fingerprint: fp_sluice_simulator`, "Simulated reply: ..." texts).

One module per concern:
  config       SimConfig, the settings (frozen; changed at runtime by swapping in a copy)
  faults       the fault model: the fault of a request from (seed, key, attempt) alone
  answers      what the simulated model says: replies, token counts, embedding vectors
  plans        one inference request planned: its token counts and the body it answers
  inference    the inference endpoints: plan, rate limits, fault, wait, answer
  limits       the RPM/TPM token buckets (server-wide and per API key) and the x-ratelimit-* headers
  background   background responses: queued, in progress, settled, cancelled
  files        the Files API
  batches      the Batch API: phases, expiry, output and error files
  webhooks     the Standard Webhooks events it sends
  messages     Anthropic's dialect; message_batches, its Message Batches
  bedrock      the Bedrock runtime's dialect
  gemini       Google's Gemini dialect: generateContent, its errors, its flex tier;
               gemini_files and gemini_batches, its Files API and Batch API
  requestlog   one log entry per /v1 request
  wire         JSON answers, OpenAI-style errors, Retry-After
  core         what the parts share: the live config, ids, attempt counters, the clock
  app          the parts wired into an aiohttp app, the middleware and the /sim admin routes
  server       SimulatorServer: the simulator on its own thread, for tests and local runs
"""

from sluice_local.simulator.answers import answer_for, count_tokens, embedding_vector, sentiment
from sluice_local.simulator.app import SIM_KEY, Simulator, create_app, serve, start
from sluice_local.simulator.config import SimConfig
from sluice_local.simulator.faults import (
    FAULT_429,
    FAULT_500,
    FAULT_DROP,
    FAULT_QUEUE_WAIT,
    FAULT_RATE_LIMIT,
    FAULT_SLOW,
    body_key,
    decide_fault,
)
from sluice_local.simulator.limits import UNLIMITED_REQUESTS, UNLIMITED_TOKENS
from sluice_local.simulator.plans import BATCH_ENDPOINTS
from sluice_local.simulator.server import SimulatorServer
from sluice_local.simulator.wire import CUSTOM_ID_HEADER, FINGERPRINT, SERVER_HEADER, ApiError

__all__ = [
    "BATCH_ENDPOINTS",
    "CUSTOM_ID_HEADER",
    "FAULT_429",
    "FAULT_500",
    "FAULT_DROP",
    "FAULT_QUEUE_WAIT",
    "FAULT_RATE_LIMIT",
    "FAULT_SLOW",
    "FINGERPRINT",
    "SERVER_HEADER",
    "SIM_KEY",
    "UNLIMITED_REQUESTS",
    "UNLIMITED_TOKENS",
    "ApiError",
    "SimConfig",
    "Simulator",
    "SimulatorServer",
    "answer_for",
    "body_key",
    "count_tokens",
    "create_app",
    "decide_fault",
    "embedding_vector",
    "sentiment",
    "serve",
    "start",
]
