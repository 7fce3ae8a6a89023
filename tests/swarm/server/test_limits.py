"""What one request may ask of `swarm serve`: a prompt checked against the KV pool the pinned trunk
leaves free (before any compute), max_tokens cut to what fits, a capped body, and strict token ids."""
import json

import httpx
import openai
import pytest

from swarm.cli.serve import pin_trunk
from swarm.server.app import DEFAULT_MAX_BODY_BYTES
from swarm.server.served_model import ServedModel
from tests.helpers.serving import MODEL, ServerThread, metric, start_engine

BLOCK = 16
POOL_TOKENS = 64 * BLOCK
TRUNK = [4 + (7 * i) % 316 for i in range(300)]   # 18 whole blocks and one of 12 tokens, all pinned
FREE_TOKENS = POOL_TOKENS - 19 * BLOCK           # 720: what a request that does not start with the trunk gets
TRUNK_REQUEST_TOKENS = FREE_TOKENS + 18 * BLOCK  # 1008: one that does shares the 18 whole blocks
SMALL_BODY_CAP = 64 * 1024
GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})


def fresh(n: int) -> list[int]:
    """n token ids that share nothing with the trunk (the first one already differs)."""
    return [5 + (11 * i) % 310 for i in range(n)]


@pytest.fixture(scope="module")
def trunk_server(model_dir):
    engine = start_engine(model_dir, kv_budget_tokens=POOL_TOKENS, block_size=BLOCK)
    tokens, blocks = pin_trunk(engine, TRUNK)
    with ServerThread(engine, ServedModel(MODEL, trunk_tokens=tokens, trunk_blocks=blocks)) as running:
        yield running


@pytest.fixture(scope="module")
def capped_server(model_dir):
    with ServerThread(start_engine(model_dir), max_body_bytes=SMALL_BODY_CAP) as running:
        yield running


def test_a_prompt_that_fits_the_pool_but_not_what_the_trunk_leaves_is_refused_before_any_compute(trunk_server):
    before = trunk_server.metrics()
    with pytest.raises(openai.BadRequestError) as refused:
        trunk_server.client().completions.create(model=MODEL, prompt=fresh(800), max_tokens=1)
    after = trunk_server.metrics()
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "prompt"
    assert f"at most {FREE_TOKENS - 1}" in refused.value.message
    assert metric(after, "swarm_tokens_computed_total") == metric(before, "swarm_tokens_computed_total")
    assert metric(after, "swarm_requests_added_total") == metric(before, "swarm_requests_added_total")


def test_a_prompt_that_starts_with_the_trunk_needs_room_only_for_its_remainder(trunk_server):
    """(Refused first: a request that continues the trunk fills its last, partial block, which
    later requests then share whole.)"""
    client = trunk_server.client()
    with pytest.raises(openai.BadRequestError, match=f"at most {TRUNK_REQUEST_TOKENS - 1} fit") as refused:
        client.completions.create(model=MODEL, prompt=TRUNK + fresh(TRUNK_REQUEST_TOKENS - len(TRUNK)))
    assert refused.value.code == "context_length_exceeded"
    prompt = TRUNK + fresh(600)
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=64000, **GREEDY)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == TRUNK_REQUEST_TOKENS - len(prompt)
    assert reply.usage.prompt_tokens_details.cached_tokens == len(TRUNK)


def test_max_tokens_beyond_what_fits_generates_up_to_it_and_ends_with_length(trunk_server):
    client = trunk_server.client()
    completion = client.completions.create(model=MODEL, prompt=fresh(700), max_tokens=64000, **GREEDY)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == FREE_TOKENS - 700
    messages = [{"role": "user", "content": "def add(a, b):"}]
    unbounded = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    assert unbounded.choices[0].finish_reason == "length"
    assert unbounded.usage.total_tokens == FREE_TOKENS
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32000, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.total_tokens == FREE_TOKENS
    assert metric(trunk_server.metrics(), "swarm_requests_total", finish_reason="error") == 0


def test_a_body_over_the_cap_gets_413_in_openais_shape_whether_sized_or_chunked(capped_server):
    body = json.dumps({"model": MODEL, "prompt": "x" * SMALL_BODY_CAP, "max_tokens": 1}).encode()
    url = capped_server.url + "/v1/completions"
    sized = httpx.post(url, content=body, headers={"content-type": "application/json"})
    chunked = httpx.post(url, content=iter([body[:1000], body[1000:]]), headers={"content-type": "application/json"})
    assert "content-length" not in chunked.request.headers
    for response in (sized, chunked):
        assert response.status_code == 413
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        assert f"{SMALL_BODY_CAP} bytes" in error["message"]
    with pytest.raises(openai.APIStatusError) as refused:
        capped_server.client().completions.create(model=MODEL, prompt="x" * SMALL_BODY_CAP, max_tokens=1)
    assert refused.value.status_code == 413
    small = capped_server.client().completions.create(model=MODEL, prompt="x" * 1000, max_tokens=1)
    assert small.usage.completion_tokens == 1


def test_the_cap_holds_behind_an_api_key(model_dir):
    body = json.dumps({"model": MODEL, "prompt": "x" * SMALL_BODY_CAP, "max_tokens": 1}).encode()
    headers = {"content-type": "application/json", "authorization": "Bearer s3cret"}
    with ServerThread(start_engine(model_dir), api_key="s3cret", max_body_bytes=SMALL_BODY_CAP) as server:
        chunked = httpx.post(server.url + "/v1/completions", content=iter([body[:1000], body[1000:]]),
                             headers=headers)
    assert chunked.status_code == 413 and "64 KiB" in chunked.json()["error"]["message"]


def test_the_default_cap_is_16_mib(model_dir):
    assert DEFAULT_MAX_BODY_BYTES == 16 * 1024 * 1024
    with ServerThread(start_engine(model_dir)) as server:
        response = httpx.post(server.url + "/v1/completions", content=b"x" * (DEFAULT_MAX_BODY_BYTES + 1),
                              headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == 413 and "16 MiB" in response.json()["error"]["message"]


@pytest.mark.parametrize("prompt, bad", [([True], "true"), ([5, False], "false"), ([5, 1.0], "1.0"),
                                         ([[5, True]], "true"), ([5, "a"], '"a"'), ([5, None], "null"),
                                         ([-1], "-1"), ([320], "320")])
def test_token_ids_must_be_integers_in_the_vocabulary(capped_server, prompt, bad):
    response = httpx.post(capped_server.url + "/v1/completions",
                          json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "prompt" and error["type"] == "invalid_request_error"
    assert "integers from 0 to 319" in error["message"] and error["message"].endswith(f"is {bad}")
