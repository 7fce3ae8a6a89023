"""`swarm serve` with one key per agent, as `swarm run` starts it: every request through each API,
streamed or whole, is its key's agent's in the exchange records, in /metrics and in the engine's KV
rows; a wrong key is each API's 401; a client that leaves still gets its request a finished record."""
import json
import threading
from dataclasses import dataclass

import anthropic
import httpx
import openai
import pytest

from swarm.server.exchanges import ExchangeFinished, ExchangeStarted
from tests.helpers.runs import TINY_HARNESS
from tests.helpers.serving import MODEL, ServerThread, failing_steps, metric, scripted, start_engine, wait_for

KEYS = {"key-alpha": "alpha", "key-beta": "beta"}
USER = [{"role": "user", "content": "Fix a.py"}]
READ_CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
OPENAI_TOOLS = TINY_HARNESS["tools"]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in OPENAI_TOOLS]
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in OPENAI_TOOLS]
GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})


class Recorder:
    """An exchange listener that keeps every record, and raises after keeping it while `failing` is set."""

    def __init__(self):
        self.starts: list[ExchangeStarted] = []
        self.ends: list[ExchangeFinished] = []
        self.failing = threading.Event()

    def started(self, record: ExchangeStarted) -> None:
        self.starts.append(record)
        self._maybe_fail()

    def finished(self, record: ExchangeFinished) -> None:
        self.ends.append(record)
        self._maybe_fail()

    def _maybe_fail(self) -> None:
        if self.failing.is_set():
            raise RuntimeError("listener fault")

    def started_one(self, request_id: str) -> ExchangeStarted:
        return next(r for r in self.starts if r.request_id == request_id)

    def finished_one(self, request_id: str) -> ExchangeFinished:
        found = wait_for(lambda: [r for r in self.ends if r.request_id == request_id])
        assert found, f"no finished record for {request_id}"
        return found[0]


class GatedSampler:
    """The engine's own sampler, held at each step until `gate` opens: a request that cannot finish yet."""

    def __init__(self, real, gate: threading.Event):
        self.real, self.gate = real, gate

    def sample(self, logits, rows):
        self.gate.wait(30)
        return self.real.sample(logits, rows)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture(scope="module")
def recorder():
    return Recorder()


@pytest.fixture(scope="module")
def server(model_dir, recorder):
    with ServerThread(start_engine(model_dir), agent_keys=KEYS, exchanges=[recorder]) as running:
        yield running


@dataclass
class Usage:
    """One request's engine id and what the client was told: prompt, cached and generated tokens, and its reply."""

    request_id: str
    prompt: int
    cached: int
    generated: int
    text: str
    tool_calls: list


def chat(server, key: str, stream: bool) -> Usage:
    client = server.client(api_key=key)
    if not stream:
        reply = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=128)
        u = reply.usage
        return Usage(reply.id, u.prompt_tokens, u.prompt_tokens_details.cached_tokens, u.completion_tokens,
                     reply.choices[0].message.content, [])
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER, max_tokens=128, stream=True,
                                                 stream_options={"include_usage": True}))
    u = chunks[-1].usage
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return Usage(chunks[0].id, u.prompt_tokens, u.prompt_tokens_details.cached_tokens, u.completion_tokens, text, [])


def messages(server, key: str, stream: bool) -> Usage:
    client = anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0)
    if stream:
        with client.messages.stream(model=MODEL, messages=USER, max_tokens=128, tools=ANTHROPIC_TOOLS) as events:
            reply = events.get_final_message()
    else:
        reply = client.messages.create(model=MODEL, messages=USER, max_tokens=128, tools=ANTHROPIC_TOOLS)
    u = reply.usage
    text = "".join(block.text for block in reply.content if block.type == "text")
    calls = [block.model_dump(exclude_none=True) for block in reply.content if block.type == "tool_use"]
    return Usage(reply.id, u.input_tokens + u.cache_read_input_tokens, u.cache_read_input_tokens, u.output_tokens,
                 text, calls)


def responses(server, key: str, stream: bool) -> Usage:
    client = server.client(api_key=key)
    if stream:
        events = list(client.responses.create(model=MODEL, input="Fix a.py", tools=RESPONSES_TOOLS, stream=True))
        reply = events[-1].response
    else:
        reply = client.responses.create(model=MODEL, input="Fix a.py", tools=RESPONSES_TOOLS)
    u = reply.usage
    calls = [item.model_dump(exclude_none=True) for item in reply.output if item.type == "function_call"]
    engine_id = "chatcmpl-" + reply.id.removeprefix("resp_")
    return Usage(engine_id, u.input_tokens, u.input_tokens_details.cached_tokens, u.output_tokens,
                 reply.output_text, calls)


API_CALLS = {"chat.completions": chat, "messages": messages, "responses": responses}


def agent_totals(server) -> dict[tuple[str, str], float]:
    samples = server.metrics()
    return {(agent, name): metric(samples, f"swarm_agent_{name}_total", agent=agent)
            for agent in KEYS.values() for name in ("requests", "prompt_tokens", "cached_tokens", "generated_tokens")}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", list(API_CALLS))
def test_each_request_is_its_keys_agents_in_the_records_and_the_metrics(server, recorder, api, stream):
    before = agent_totals(server)
    with scripted(server, "Let me look. " + READ_CALL, "Done."):
        first = API_CALLS[api](server, "key-alpha", stream)
        second = API_CALLS[api](server, "key-beta", stream)
    for usage, agent in ((first, "alpha"), (second, "beta")):
        started, finished = recorder.started_one(usage.request_id), recorder.finished_one(usage.request_id)
        assert (started.agent, finished.agent, started.api, finished.api) == (agent, agent, api, api)
        assert started.request["model"] == MODEL and started.prompt_tokens == finished.prompt_tokens == usage.prompt
        assert (finished.cached_tokens, finished.generated_tokens) == (usage.cached, usage.generated)
        assert finished.error is None and json.loads(json.dumps(finished.to_json()))["event"] == "finished"
    assert [recorder.finished_one(first.request_id).tool_calls, recorder.finished_one(second.request_id).tool_calls] \
        == [first.tool_calls, second.tool_calls]
    assert [recorder.finished_one(u.request_id).text for u in (first, second)] == [first.text, second.text]
    after = agent_totals(server)
    for usage, agent in ((first, "alpha"), (second, "beta")):
        grew = {name: after[who, name] - before[who, name] for who, name in before if who == agent}
        assert grew == {"requests": 1, "prompt_tokens": usage.prompt, "cached_tokens": usage.cached,
                        "generated_tokens": usage.generated}


def test_a_tool_call_is_recorded_as_each_api_gave_it_to_its_client(server, recorder):
    with scripted(server, READ_CALL):
        calls = {api: call(server, "key-alpha", False) for api, call in API_CALLS.items()}
    openai_call = server.client(api_key="key-alpha")
    with scripted(server, READ_CALL):
        chat_reply = openai_call.chat.completions.create(model=MODEL, messages=USER, max_tokens=128, tools=OPENAI_TOOLS)
    records = {api: recorder.finished_one(usage.request_id) for api, usage in calls.items()}
    assert records["messages"].tool_calls == calls["messages"].tool_calls
    assert records["messages"].tool_calls[0]["type"] == "tool_use" and records["messages"].finish_reason == "tool_use"
    assert records["responses"].tool_calls == calls["responses"].tool_calls
    assert records["responses"].tool_calls[0]["type"] == "function_call"
    chat_record = recorder.finished_one(chat_reply.id)
    assert chat_record.finish_reason == "tool_calls" == chat_reply.choices[0].finish_reason
    assert chat_record.tool_calls == [call.model_dump() for call in chat_reply.choices[0].message.tool_calls]


def test_a_wrong_or_missing_key_is_each_apis_401_and_starts_nothing(server, recorder):
    seen = len(recorder.starts)
    for key in ("wrong", "key-alph"):
        with pytest.raises(openai.AuthenticationError) as chat_refused:
            server.client(api_key=key).chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
        with pytest.raises(openai.AuthenticationError) as responses_refused:
            server.client(api_key=key).responses.create(model=MODEL, input="hi", max_output_tokens=2)
        with pytest.raises(anthropic.AuthenticationError) as messages_refused:
            anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0).messages.create(
                model=MODEL, messages=USER, max_tokens=2)
        assert chat_refused.value.code == responses_refused.value.code == "invalid_api_key"
        assert messages_refused.value.body["error"]["type"] == "authentication_error"
        assert "x-api-key" in messages_refused.value.body["error"]["message"]
    keyless = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": USER})
    assert keyless.status_code == 401 and keyless.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/health").status_code == 200
    assert len(recorder.starts) == seen


def test_a_live_requests_kv_rows_map_to_its_agent_and_leaving_mid_stream_still_finishes_its_record(server,
                                                                                                    recorder):
    stream = server.client(api_key="key-beta").completions.create(model=MODEL, prompt="def add(a, b):",
                                                                   max_tokens=1500, stream=True, **GREEDY)
    chunks = [next(stream) for _ in range(3)]
    kv_rows = server.async_engine.snapshot_blocking().kv.requests
    stream.close()
    request_id = chunks[0].id
    agents = {row.request_id: recorder.started_one(row.request_id).agent for row in kv_rows}
    finished = recorder.finished_one(request_id)
    assert agents == {request_id: "beta"}
    assert recorder.started_one(request_id).api == "completions" and finished.agent == "beta"
    assert finished.finish_reason == "cancelled" and finished.error is None
    assert 3 <= finished.generated_tokens < 1500
    assert finished.text.startswith("".join(chunk.choices[0].text for chunk in chunks))


def test_a_client_that_leaves_before_a_whole_reply_still_gets_a_finished_record(server, recorder):
    gate = threading.Event()
    server.async_engine.call(lambda engine: setattr(engine, "sampler", GatedSampler(engine.sampler, gate))).result()
    seen = len(recorder.starts)
    try:
        with pytest.raises(openai.APITimeoutError):
            server.client(api_key="key-alpha", timeout=1).chat.completions.create(model=MODEL, messages=USER,
                                                                                  max_tokens=8)
        started = wait_for(lambda: recorder.starts[seen:])
        finished = recorder.finished_one(started[0].request_id)
    finally:
        gate.set()
    assert (finished.agent, finished.finish_reason, finished.generated_tokens) == ("alpha", "cancelled", 0)


def test_a_failed_request_is_finished_with_the_engines_error_whole_or_streamed(server, recorder):
    seen = len(recorder.starts)
    with failing_steps(server, 2):
        with pytest.raises(openai.InternalServerError, match="injected fault"):
            server.client(api_key="key-alpha").chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
        streamed = list(server.client(api_key="key-beta").responses.create(model=MODEL, input="hi", stream=True))
    assert streamed[-1].type == "response.failed"
    records = [recorder.finished_one(started.request_id) for started in recorder.starts[seen:]]
    assert [(r.agent, r.api, r.finish_reason) for r in records] == [("alpha", "chat.completions", "error"),
                                                                    ("beta", "responses", "error")]
    assert all("injected fault" in r.error and r.generated_tokens == 0 for r in records)


def test_a_listener_that_raises_fails_no_request(server, recorder):
    before = agent_totals(server)
    recorder.failing.set()
    try:
        with scripted(server, "Done."):
            usage = chat(server, "key-alpha", stream=True)
            whole = messages(server, "key-beta", stream=False)
    finally:
        recorder.failing.clear()
    assert usage.text == whole.text == "Done."
    after = agent_totals(server)
    assert after["alpha", "requests"] - before["alpha", "requests"] == 1
    assert after["beta", "generated_tokens"] - before["beta", "generated_tokens"] == whole.generated


def test_one_api_key_and_agent_keys_together_let_in_both(model_dir):
    with ServerThread(start_engine(model_dir), api_key="s3cret", agent_keys={"k1": "solo"}) as keyed, \
            scripted(keyed, "ok"):
        plain = keyed.client(api_key="s3cret").chat.completions.create(model=MODEL, messages=USER, max_tokens=4)
        agents = keyed.client(api_key="k1").chat.completions.create(model=MODEL, messages=USER, max_tokens=4)
        samples = keyed.metrics()
    assert plain.choices[0].message.content == agents.choices[0].message.content == "ok"
    assert metric(samples, "swarm_agent_requests_total", agent="solo") == 1
