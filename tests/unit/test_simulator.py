"""The provider simulator: answers and token counts, OpenAI SDK compatibility, background responses,
its errors and auth (`sim_client` holds the helpers, conftest the server)."""

from __future__ import annotations

import math
import time

import openai
import pytest

from sluice_local.simulator import (
    SimulatorServer,
    answer_for,
    count_tokens,
    sentiment,
)
from tests.unit.sim_client import SENTIMENT, chat_body, client, http, wait_for


def test_sentiment_lexicon_and_ties() -> None:
    assert sentiment("A great, wonderful film. I loved it.") == "positive"
    assert sentiment("Boring and awful; a waste of time.") == "negative"
    assert sentiment("It was not good at all.") == "negative"
    assert sentiment("An ordinary film about a table.") == "positive"
    assert sentiment("good but bad") == "positive"


def test_answers_and_tokens_are_deterministic() -> None:
    assert answer_for(SENTIMENT + "Terrible plot, awful acting.") == "negative"
    other = answer_for("Tell me about rivers.")
    assert other == answer_for("Tell me about rivers.")
    assert other != answer_for("Tell me about stones.")
    assert other.startswith("Simulated reply:")
    assert count_tokens("one two three four five six seven eight nine ten") == 13
    assert count_tokens("") == 0


# OpenAI SDK compatibility


def test_chat_completion_parses_in_sdk(sim: SimulatorServer) -> None:
    api = client(sim)
    good = api.chat.completions.create(
        model="gpt-sim", messages=[{"role": "user", "content": SENTIMENT + "I loved it, a great and moving story."}]
    )
    bad = api.chat.completions.create(
        model="gpt-sim",
        messages=[
            {"role": "system", "content": "You classify reviews."},
            {"role": "user", "content": [{"type": "text", "text": SENTIMENT + "Dull, boring, the worst."}]},
        ],
    )
    assert good.id.startswith("chatcmpl-")
    assert good.object == "chat.completion"
    assert good.model == "gpt-sim"
    assert good.system_fingerprint == "fp_sluice_simulator"
    assert good.choices[0].message.content == "positive"
    assert good.choices[0].finish_reason == "stop"
    assert bad.choices[0].message.content == "negative"
    assert good.usage is not None
    assert good.usage.completion_tokens == 1
    assert good.usage.total_tokens == good.usage.prompt_tokens + good.usage.completion_tokens


def test_models_are_listed_as_an_openai_compatible_server_lists_them(sim: SimulatorServer) -> None:
    # `sluice run` asks for them before a job: a 404 there reads as a base URL with a wrong path
    models = [m.id for m in client(sim).models.list()]
    assert "gpt-4o-mini" in models


def test_chat_respects_max_tokens(sim: SimulatorServer) -> None:
    full = client(sim).chat.completions.create(model="m", messages=[{"role": "user", "content": "Describe a river."}])
    cut = client(sim).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Describe a river."}], max_completion_tokens=3
    )
    assert full.usage is not None and cut.usage is not None
    assert full.usage.completion_tokens > 3
    assert cut.usage.completion_tokens <= 3
    assert cut.choices[0].finish_reason == "length"
    assert (full.choices[0].message.content or "").startswith(cut.choices[0].message.content or "")


def test_completions_parse_in_sdk(sim: SimulatorServer) -> None:
    done = client(sim).completions.create(model="m", prompt=SENTIMENT + "Excellent value, works great.", max_tokens=50)
    assert done.object == "text_completion"
    assert done.choices[0].text == "positive"
    assert done.usage is not None and done.usage.completion_tokens == 1


def test_responses_parse_in_sdk(sim: SimulatorServer) -> None:
    api = client(sim)
    answer = api.responses.create(
        model="m", input=[{"role": "user", "content": SENTIMENT + "Broken on arrival, useless."}], metadata={"k": "v"}
    )
    plain = api.responses.create(model="m", input="What is a sluice?")
    assert answer.id.startswith("resp_")
    assert answer.object == "response"
    assert answer.status == "completed"
    assert answer.output_text == "negative"
    assert answer.incomplete_details is None
    assert answer.metadata == {"k": "v"}
    assert answer.usage is not None
    assert answer.usage.total_tokens == answer.usage.input_tokens + answer.usage.output_tokens
    assert plain.output_text == answer_for("What is a sluice?")


def test_embeddings_are_deterministic_unit_vectors(sim: SimulatorServer) -> None:
    api = client(sim)
    first = api.embeddings.create(model="emb", input=["alpha", "beta"])
    again = api.embeddings.create(model="emb", input="alpha", dimensions=16)
    wide = api.embeddings.create(model="emb", input="alpha", dimensions=40)
    assert [d.index for d in first.data] == [0, 1]
    assert len(first.data[0].embedding) == 16
    assert first.data[0].embedding == again.data[0].embedding
    assert first.data[0].embedding != first.data[1].embedding
    assert math.isclose(sum(v * v for v in first.data[0].embedding), 1.0, rel_tol=1e-6)
    assert len(wide.data[0].embedding) == 40
    assert first.usage.prompt_tokens == 2


def test_background_response_lifecycle(sim: SimulatorServer) -> None:
    sim.configure(latency_s=0.5)
    api = client(sim)
    created = api.responses.create(model="m", input=SENTIMENT + "Lovely.", background=True)
    assert created.status == "queued"
    assert created.output == []
    time.sleep(0.2)
    assert api.responses.retrieve(created.id).status == "in_progress"
    done = wait_for(lambda: (r := api.responses.retrieve(created.id)).status == "completed" and r)
    assert done.output_text == "positive"
    assert done.usage is not None and done.usage.output_tokens == 1
    # terminal responses are not cancelled again
    assert api.responses.cancel(created.id).status == "completed"


def test_background_cancel(sim: SimulatorServer) -> None:
    sim.configure(latency_s=2.0)
    api = client(sim)
    created = api.responses.create(model="m", input="slow work", background=True)
    cancelled = api.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert api.responses.retrieve(created.id).status == "cancelled"


def test_background_incomplete_and_failed(sim: SimulatorServer) -> None:
    api = client(sim)
    sim.configure(incomplete_rate=1.0)
    started = api.responses.create(model="m", input="Describe a calm river in detail.", background=True)
    incomplete = wait_for(
        lambda: (r := api.responses.retrieve(started.id)).status != "queued" and r.status != "in_progress" and r
    )
    assert incomplete.status == "incomplete"
    assert incomplete.incomplete_details is not None
    assert incomplete.incomplete_details.reason == "max_output_tokens"
    assert incomplete.output_text
    assert answer_for("Describe a calm river in detail.").startswith(incomplete.output_text)
    sim.configure(incomplete_rate=0.0, failed_rate=1.0)
    started = api.responses.create(model="m", input="Another", background=True)
    failed = wait_for(lambda: (r := api.responses.retrieve(started.id)).status == "failed" and r)
    assert failed.error is not None and failed.error.code == "server_error"
    assert failed.output == []


def test_unknown_response_is_404(sim: SimulatorServer) -> None:
    with pytest.raises(openai.NotFoundError):
        client(sim).responses.retrieve("resp_missing")
    status, _, body = http("POST", f"{sim.base_url}/responses/resp_missing/cancel", {})
    assert status == 404
    assert body["error"]["type"] == "invalid_request_error"


# validation, auth, headers


def test_missing_model_is_openai_shaped_400(sim: SimulatorServer) -> None:
    status, headers, body = http("POST", f"{sim.base_url}/chat/completions", {"messages": []})
    assert status == 400
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == "model"
    assert headers["x-request-id"].startswith("req_")
    assert headers["server"] == "sluice-simulator"


def test_unknown_fields_are_ignored(sim: SimulatorServer) -> None:
    status, _, body = http("POST", f"{sim.base_url}/chat/completions", chat_body("hi", max_queue_wait_s=30, foo=1))
    assert status == 200
    assert body["choices"][0]["message"]["content"] == answer_for("hi")


def test_auth(sim: SimulatorServer) -> None:
    status, _, body = http("POST", f"{sim.base_url}/chat/completions", chat_body("hi"), {"Authorization": ""})
    assert status == 401
    assert body["error"]["code"] == "missing_api_key"
    sim.configure(api_key="sk-right")
    with pytest.raises(openai.AuthenticationError):
        client(sim, key="sk-wrong").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert client(sim, key="sk-right").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert sim.config.api_key == "sk-right"
    status, _, public = http("GET", f"{sim.url}/sim/config")
    assert public["api_key"] == "***"


def test_unknown_route_is_openai_shaped(sim: SimulatorServer) -> None:
    status, _, body = http("POST", f"{sim.base_url}/nothing", {})
    assert status == 404
    assert body["error"]["code"] == "unknown_url"


# faults
