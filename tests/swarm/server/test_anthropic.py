"""`swarm serve`'s Anthropic Messages API over real HTTP, with the official `anthropic` client, on the
tiny model: the same conversation as through chat completions gives the same prompt, tokens and cache."""
import json

import anthropic
import httpx
import pytest

from swarm.server.anthropic_protocol import chat_inputs_from_body
from swarm.server.chat_prompt import ChatPrompter
from swarm.server.protocol import ChatMessage
from tests.helpers.runs import TINY_HARNESS, tiny_tokenizer
from tests.helpers.serving import MODEL, REPO, ServerThread, failing_steps, scripted, start_engine

SYSTEM_BLOCKS = [{"type": "text", "text": "You are a coding agent."},
                 {"type": "text", "text": " Be brief.", "cache_control": {"type": "ephemeral"}}]
OPENAI_SYSTEM = {"role": "system", "content": "You are a coding agent. Be brief."}
TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
          "input_schema": t["function"]["parameters"]} for t in TINY_HARNESS["tools"]]
READ_CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
USER = [{"role": "user", "content": "Fix a.py"}]
CLAUDE_CODE_BODY = REPO / "tests/data/harness_requests/claude-code/alpha-1.json"
GREEDY = {"extra_body": {"temperature": 0}}   # the SDK has no temperature argument any more; the API has


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def test_the_same_conversation_as_chat_completions_gives_the_same_greedy_tokens_and_cache(server, client):
    user = [{"role": "user", "content": [{"type": "text", "text": "def add(a, b):"},
                                         {"type": "text", "text": " return"}]}]
    openai_user = [{"role": "user", "content": [{"type": "text", "text": "def add(a, b):"},
                                                {"type": "text", "text": " return"}]}]
    chat = server.client().chat.completions.create(model=MODEL, messages=[OPENAI_SYSTEM, *openai_user],
                                                   max_tokens=8, temperature=0)
    reply = client.messages.create(model=MODEL, system=SYSTEM_BLOCKS, messages=user, max_tokens=8, **GREEDY)
    again = server.client().chat.completions.create(model=MODEL, messages=[OPENAI_SYSTEM, *openai_user],
                                                    max_tokens=8, temperature=0)
    assert [block.type for block in reply.content] == ["text"]
    assert reply.content[0].text == chat.choices[0].message.content
    assert reply.usage.output_tokens == chat.usage.completion_tokens
    usage = reply.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert usage.cache_read_input_tokens == again.usage.prompt_tokens_details.cached_tokens > 0
    assert usage.cache_creation_input_tokens == 0
    assert reply.id.startswith("msg_") and reply.type == "message" and reply.role == "assistant"
    assert reply.model == MODEL and reply.stop_reason == ("max_tokens" if usage.output_tokens == 8 else "end_turn")
    count = client.messages.count_tokens(model=MODEL, system=SYSTEM_BLOCKS, messages=user)
    assert count.input_tokens == chat.usage.prompt_tokens


def test_streamed_replies_add_up_to_the_whole_one(server, client):
    whole = client.messages.create(model=MODEL, messages=USER, max_tokens=6, **GREEDY)
    with client.messages.stream(model=MODEL, messages=USER, max_tokens=6, **GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == whole.content[0].text == final.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)
    assert final.usage.cache_read_input_tokens > 0   # the whole reply's request cached the prompt
    events = list(client.messages.create(model=MODEL, messages=USER, max_tokens=6, **GREEDY, stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start" and kinds[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[0].message.usage.cache_read_input_tokens == final.usage.cache_read_input_tokens
    raw = httpx.post(server.url + "/v1/messages", json={"model": MODEL, "messages": USER, "max_tokens": 2,
                                                        "stream": True}).text
    assert raw.startswith("event: message_start\ndata: {") and "event: ping\ndata: {\"type\": \"ping\"}" in raw


def test_a_tool_call_and_its_result_over_two_turns_reuse_the_first_turns_cache(server, client):
    with scripted(server, f"Let me look.\n{READ_CALL}", "Fixed."):
        first = client.beta.messages.create(model=MODEL, system=SYSTEM_BLOCKS, messages=USER, tools=TOOLS,
                                            max_tokens=200, betas=["interleaved-thinking-2025-05-14"])
        call = first.content[1]
        history = [*USER, {"role": "assistant", "content": [block.model_dump() for block in first.content]},
                   {"role": "user", "content": [
                       {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "x = 1"}],
                        "is_error": False},
                       {"type": "text", "text": "Go on."}]}]
        second = client.messages.create(model=MODEL, system=SYSTEM_BLOCKS, messages=history, tools=TOOLS,
                                        max_tokens=200)
    assert first.stop_reason == "tool_use" and first.content[0].text == "Let me look.\n"
    assert (call.type, call.name, call.input) == ("tool_use", "read_file", {"path": "a.py"})
    assert call.id.startswith("toolu_")
    assert second.content[0].text == "Fixed." and second.stop_reason == "end_turn"
    openai_history = [OPENAI_SYSTEM, *USER,
                      {"role": "assistant", "content": "Let me look.\n", "tool_calls": [{
                          "id": "call_1", "type": "function",
                          "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "x = 1"},
                      {"role": "user", "content": "Go on."}]
    prompt = ChatPrompter(tiny_tokenizer()).build([ChatMessage.model_validate(m) for m in openai_history],
                                                  TINY_HARNESS["tools"])
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == len(prompt.token_ids)
    first_prompt = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens >= first_prompt - 1


def test_a_streamed_tool_call_is_a_tool_use_block_of_input_json(server, client):
    with scripted(server, READ_CALL):
        events = list(client.messages.create(model=MODEL, messages=USER, tools=TOOLS, max_tokens=200, stream=True))
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert [(b.type, b.name, b.input) for b in starts] == [("tool_use", "read_file", {})]
    assert [json.loads(d.partial_json) for d in deltas] == [{"path": "a.py"}]
    assert [e.delta.stop_reason for e in events if e.type == "message_delta"] == ["tool_use"]


def test_tool_choice_any_or_tool_starts_the_reply_with_the_call_so_the_model_writes_only_the_rest(server, client):
    rest_of_any = 'read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    rest_of_tool = '{"path": "b.py", "content": "x = 1"}}\n</tool_call>'
    with scripted(server, rest_of_any, rest_of_tool):
        any_call = client.messages.create(model=MODEL, messages=USER, tools=TOOLS, max_tokens=200,
                                          tool_choice={"type": "any"})
        with client.messages.stream(model=MODEL, messages=USER, tools=TOOLS, max_tokens=200,
                                    tool_choice={"type": "tool", "name": "write_file"}) as stream:
            tool_call = stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in any_call.content] == [("tool_use", "read_file", {"path": "a.py"})]
    assert [(b.type, b.name, b.input) for b in tool_call.content] == [
        ("tool_use", "write_file", {"path": "b.py", "content": "x = 1"})]
    assert any_call.stop_reason == tool_call.stop_reason == "tool_use"
    generated = len(tiny_tokenizer().encode(rest_of_tool)) + 1   # and the EOS
    assert tool_call.usage.output_tokens == generated
    plain = client.messages.count_tokens(model=MODEL, messages=USER, tools=TOOLS).input_tokens
    forced = len(tiny_tokenizer().encode('<tool_call>\n{"name": "write_file", "arguments": '))
    assert tool_call.usage.input_tokens + tool_call.usage.cache_read_input_tokens == plain + forced


def test_a_stop_sequence_ends_the_reply_and_is_named(server, client):
    with scripted(server, "abc END def", "abc END def"):
        whole = client.messages.create(model=MODEL, messages=USER, max_tokens=50, stop_sequences=["END", "zzz"])
        with client.messages.stream(model=MODEL, messages=USER, max_tokens=50, stop_sequences=["END"]) as stream:
            streamed = stream.get_final_message()
    for reply in (whole, streamed):
        assert (reply.content[0].text, reply.stop_reason, reply.stop_sequence) == ("abc ", "stop_sequence", "END")


def test_claude_codes_real_request_is_taken_with_its_extra_fields(client):
    body = json.loads(CLAUDE_CODE_BODY.read_text())
    assert {"thinking", "metadata", "context_management", "output_config"} <= set(body)
    counted = httpx.post(str(client.base_url) + "/v1/messages/count_tokens?beta=true", json={**body, "model": MODEL},
                         headers={"anthropic-version": "2023-06-01", "anthropic-beta": "oauth-2025-04-20"})
    inputs = chat_inputs_from_body(body)
    prompt = ChatPrompter(tiny_tokenizer()).build(inputs.messages, inputs.tools, inputs.tool_choice)
    assert counted.status_code == 200 and counted.json() == {"input_tokens": len(prompt.token_ids)}
    assert [m.role for m in inputs.messages][:3] == ["system", "user", "system"] and len(inputs.tools) == 24


@pytest.mark.parametrize("change, status, fragment", [
    ({"max_tokens": None}, 400, "max_tokens"),
    ({"model": "claude-opus-4-8"}, 404, "does not exist"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400, "'image'"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "server tools"),
    ({"temperature": 1.5}, 400, "temperature"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, 400, "'nope'"),
])
def test_a_bad_request_gets_anthropics_error_shape(server, change, status, fragment):
    body = {k: v for k, v in {"model": MODEL, "messages": USER, "max_tokens": 4, **change}.items() if v is not None}
    reply = httpx.post(server.url + "/v1/messages", json=body)
    kind = {400: "invalid_request_error", 404: "not_found_error"}[status]
    assert reply.status_code == status and reply.json()["type"] == "error"
    assert reply.json()["error"]["type"] == kind and fragment in reply.json()["error"]["message"]


def test_the_official_client_raises_the_matching_errors_and_finds_the_model(client):
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", messages=USER, max_tokens=4)
    assert missing.value.body["error"]["type"] == "not_found_error"
    assert client.models.retrieve(MODEL).id == MODEL
    assert [m.id for m in client.models.list().data] == [MODEL]
    with pytest.raises(anthropic.NotFoundError):
        client.models.retrieve("nope")


def test_an_api_key_is_taken_as_x_api_key_or_bearer_and_max_tokens_is_clamped(model_dir):
    with ServerThread(start_engine(model_dir, kv_budget_tokens=256, block_size=16), api_key="s3cret") as keyed, \
            scripted(keyed, "x" * 2000):
        by_key = anthropic.Anthropic(base_url=keyed.url, api_key="s3cret", max_retries=0)
        by_bearer = anthropic.Anthropic(base_url=keyed.url, auth_token="s3cret", max_retries=0)
        wrong = anthropic.Anthropic(base_url=keyed.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as refused:
            wrong.messages.create(model=MODEL, messages=USER, max_tokens=4)
        with by_key.messages.stream(model=MODEL, messages=USER, max_tokens=64000) as stream:   # the SDK streams
            reply = stream.get_final_message()                                                # a long reply
        assert by_bearer.messages.count_tokens(model=MODEL, messages=USER).input_tokens > 0
    assert refused.value.status_code == 401 and refused.value.body["error"]["type"] == "authentication_error"
    assert "x-api-key" in refused.value.body["error"]["message"]
    assert reply.stop_reason == "max_tokens"
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens + reply.usage.output_tokens == 256


def test_a_failing_engine_step_is_an_api_error_whole_or_an_error_event_streamed(server, client):
    with failing_steps(server, 2):
        with pytest.raises(anthropic.InternalServerError, match="injected fault") as whole:
            client.messages.create(model=MODEL, messages=USER, max_tokens=3)
        streamed = httpx.post(server.url + "/v1/messages", json={"model": MODEL, "messages": USER, "max_tokens": 3,
                                                                 "stream": True, "temperature": None}).text
    assert whole.value.body["error"]["type"] == "api_error"
    assert streamed.startswith("event: error\ndata: ")
    assert json.loads(streamed.split("data: ", 1)[1])["error"]["type"] == "api_error"
