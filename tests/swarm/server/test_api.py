"""`swarm serve`'s OpenAI API over real HTTP, with the official client, on the tiny model."""
import json

import httpx
import openai
import pytest

from engine.llm import LLM
from engine.sampling import SamplingParams
from tests.helpers.serving import MODEL, ServerThread, failing_steps, metric, start_engine, wait_for

GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})
USER = [{"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def reference(model_dir):
    llm = LLM(str(model_dir), device="cpu", dtype="float32")

    def greedy(prompt_ids: list[int], max_tokens: int) -> str:
        out = llm.generate(prompt_ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0]
        return llm.tokenizer.decode(out.token_ids)
    greedy.tokenizer = llm.tokenizer
    return greedy


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_chat_reply_is_the_engines_greedy_continuation_of_the_rendered_messages(client, reference):
    reply = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=10, **GREEDY)
    prompt_ids = reference.tokenizer.encode(reference.tokenizer.apply_chat_template(USER))
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.tool_calls is None
    assert choice.message.content == reference(prompt_ids, 10)
    assert choice.finish_reason == "length"
    assert reply.usage.prompt_tokens == len(prompt_ids) and reply.usage.completion_tokens == 10
    assert reply.usage.total_tokens == len(prompt_ids) + 10
    assert reply.id.startswith("chatcmpl-") and reply.object == "chat.completion"


def test_streamed_chat_adds_up_to_the_whole_reply_and_ends_with_usage(client):
    whole = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=12, **GREEDY)
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER, max_tokens=12, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1
    assert all(c.usage is None for c in chunks[:-1])


def test_cached_tokens_count_the_shared_prefix(client, reference):
    system = {"role": "system", "content": "The quick brown fox jumps over the lazy dog. " * 6}
    conversations = [[system, {"role": "user", "content": name}] for name in ("a", "b")]
    first, second = (client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, **GREEDY)
                     for messages in conversations)
    a, b = (reference.tokenizer.encode(reference.tokenizer.apply_chat_template(m)) for m in conversations)
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert shared > 64
    assert first.usage.prompt_tokens_details.cached_tokens < 16  # the chat template's opening, seen before
    assert second.usage.prompt_tokens_details.cached_tokens == shared


def test_completions_take_text_or_token_ids_and_stream_the_same_text(client, reference):
    ids = reference.tokenizer.encode("import os\nprint(")
    by_text = client.completions.create(model=MODEL, prompt="import os\nprint(", max_tokens=8, **GREEDY)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, **GREEDY)
    streamed = list(client.completions.create(model=MODEL, prompt=ids, max_tokens=8, stream=True,
                                              stream_options={"include_usage": True}, **GREEDY))
    assert by_text.choices[0].text == by_ids.choices[0].text == reference(ids, 8)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == by_ids.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids) and streamed[-1].usage.completion_tokens == 8
    assert by_ids.usage.prompt_tokens_details.cached_tokens == len(ids) - 1
    assert by_ids.object == "text_completion" and by_ids.choices[0].finish_reason == "length"


def test_a_stop_string_cuts_the_text_before_it(client):
    free = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=24, **GREEDY).choices[0].text
    stop = free[len(free) // 2:len(free) // 2 + 3]
    cut = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=24, stop=[stop], **GREEDY)
    streamed = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=24, stop=stop,
                                         stream=True, **GREEDY)
    assert cut.choices[0].text == free[:free.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text


@pytest.mark.parametrize("request_options, status, param", [
    (dict(model="gpt-4"), 404, "model"),
    (dict(messages=[]), 400, "messages"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages.0.role"),
    (dict(temperature=5), 400, "temperature"),
    (dict(max_tokens=0), 400, "max_tokens"),
    (dict(n=2), 400, "n"),
    (dict(seed=2**70), 400, "seed"),
    (dict(messages=[{"role": "user", "content": "\ud800"}]), 400, "messages"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), 400, "tools"),
    (dict(tool_choice="required"), 400, "tool_choice"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
     "messages"),
    (dict(messages=[{"role": "user", "content": "x " * 3000}]), 400, "messages"),
])
def test_a_bad_chat_request_gets_an_openai_error(server, request_options, status, param):
    body = {"model": MODEL, "messages": USER, "max_tokens": 4, **request_options}
    response = httpx.post(server.url + "/v1/chat/completions", content=json.dumps(body),  # ASCII, as JSON allows
                          headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["message"]
    assert error["type"] == "invalid_request_error"


def test_the_official_client_raises_the_matching_errors(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4", messages=USER)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL, prompt=[5] * 2048, max_tokens=1)
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="integers from 0 to 319; item 1 is 100000"):
        client.completions.create(model=MODEL, prompt=[5, 100000], max_tokens=1)


def test_malformed_bodies_and_unknown_routes_get_error_bodies(server):
    cases = [httpx.post(server.url + "/v1/chat/completions", content=b"{not json",
                        headers={"content-type": "application/json"}),
             httpx.post(server.url + "/v1/completions", json=[1, 2]),
             httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": []}),
             httpx.get(server.url + "/v1/engines"),
             httpx.get(server.url + "/v1/chat/completions")]
    assert [r.status_code for r in cases] == [400, 400, 400, 404, 405]
    for response in cases:
        assert response.json()["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_failing_engine_step_fails_its_request_with_a_500_and_the_server_goes_on(server, client):
    with failing_steps(server, 2):
        with pytest.raises(openai.InternalServerError, match="injected fault"):
            client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3, **GREEDY)
        with pytest.raises(openai.APIError, match="injected fault"):
            list(client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3, stream=True, **GREEDY))
        after = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3, **GREEDY)
    assert after.usage.completion_tokens == 3
    assert metric(server.metrics(), "swarm_engine_step_errors_total") >= 2


def test_a_client_that_gives_up_on_a_whole_response_cancels_it(server):
    before = metric(server.metrics(), "swarm_requests_total", finish_reason="cancelled")
    body = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(5, read=0.3))
    samples = wait_for(lambda: (s := server.metrics()) and
                       metric(s, "swarm_requests_total", finish_reason="cancelled") > before and s)
    assert samples, "the abandoned request was not cancelled"
    assert metric(samples, "swarm_num_requests_running") == 0
    assert metric(samples, "swarm_kv_blocks", state="in_use") == 0


def test_null_fields_mean_not_given(server):
    body = {"model": MODEL, "messages": USER, "max_tokens": 3, "temperature": None, "top_p": None, "stop": None,
            "stream": None, "stream_options": None, "tools": None, "seed": None, "n": None}
    response = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] <= 3


def test_a_vanishing_temperature_is_greedy_not_a_failed_step(server, client):
    greedy = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, **GREEDY)
    tiny = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, temperature=1e-30, seed=3,
                                          extra_body={"ignore_eos": True})
    assert tiny.choices[0].message.content == greedy.choices[0].message.content


def test_an_api_key_guards_v1_and_leaves_health_and_metrics_open(model_dir):
    with ServerThread(start_engine(model_dir), api_key="s3cret") as keyed:
        with pytest.raises(openai.AuthenticationError) as refused:
            keyed.client(api_key="wrong").chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
        assert refused.value.code == "invalid_api_key" and "Bearer" in refused.value.message
        bare = httpx.post(keyed.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
        assert bare.status_code == 401 and bare.json()["error"]["type"] == "invalid_request_error"
        reply = keyed.client(api_key="s3cret").chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
        assert reply.usage.completion_tokens == 2
        assert httpx.get(keyed.url + "/health").status_code == 200
        assert httpx.get(keyed.url + "/metrics").status_code == 200
