"""`POST /v1/responses` over real HTTP with the official openai client, on the tiny model: text and
function calls (namespaced and dotted names round-trip), several turns of calls and outputs, the
documented stream events, max_output_tokens, the refusals, and the same tokens as chat completions."""
import json
from pathlib import Path

import openai
import pytest

from swarm.server.responses_protocol import chat_inputs_from_body
from tests.helpers.runs import TINY_HARNESS, tiny_tokenizer
from tests.helpers.serving import MODEL, ServerThread, script, start_engine

CODEX_REQUEST = Path(__file__).resolve().parents[2] / "data" / "harness_requests" / "codex" / "alpha-1.json"
INSTRUCTIONS = "You are a coding agent."
READ_FILE = {"type": "function", **TINY_HARNESS["tools"][0]["function"]}
NAMESPACE = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
    {"type": "function", "name": "spawn_agent", "description": "Start one.",
     "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}]}
DOTTED = {"type": "function", "name": "github.open", "description": "Open an issue.",
          "parameters": {"type": "object", "properties": {"title": {"type": "string"}}}}
TOOLS = [READ_FILE, NAMESPACE, DOTTED, {"type": "web_search", "external_web_access": False}]
SEEN_NAMES = ["github_open", "multi_agent_v1__spawn_agent", "read_file"]
GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})
SMALL_POOL = 256


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_string_input_and_instructions_are_a_system_and_a_user_message(server, client):
    script(server, "Hi there.")
    reply = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input="Fix a.py", store=False,
                                    reasoning={"summary": "auto"}, include=["reasoning.encrypted_content"],
                                    prompt_cache_key="agent-1", metadata={"run": "1"}, truncation="disabled")
    tokenizer = tiny_tokenizer()
    expected = tokenizer.encode(tokenizer.apply_chat_template([{"role": "system", "content": INSTRUCTIONS},
                                                               {"role": "user", "content": "Fix a.py"}]))
    assert reply.id.startswith("resp_") and reply.object == "response" and reply.status == "completed"
    assert reply.output_text == "Hi there." and [item.type for item in reply.output] == ["message"]
    message = reply.output[0]
    assert message.role == "assistant" and message.status == "completed" and message.content[0].annotations == []
    assert reply.usage.input_tokens == len(expected)
    assert reply.usage.output_tokens == len(tokenizer.encode("Hi there.")) + 1   # and the end of the turn
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert reply.usage.output_tokens_details.reasoning_tokens == 0 and reply.incomplete_details is None


def test_the_stream_sends_the_documented_events_and_the_same_response(server, client):
    script(server, "Hello there, friend.")
    events = list(client.responses.create(model=MODEL, input=[{"role": "user", "content": "hi"}], stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == "Hello there, friend." == final.output_text and final.usage.input_tokens > 0
    with client.responses.stream(model=MODEL, input="hi") as stream:
        assert stream.get_final_response().output_text == "Hello there, friend."


def test_namespaced_and_dotted_tools_are_flattened_and_their_calls_come_back_as_the_client_named_them(
        server, client):
    assert sorted(t["function"]["name"] for t in chat_inputs_from_body(
        {"model": MODEL, "input": "x", "tools": TOOLS}).tools) == SEEN_NAMES
    both = f"Let me look.\n{call('multi_agent_v1__spawn_agent', task='tests')}\n{call('github_open', title='bug')}"
    script(server, both, both)
    whole = client.responses.create(model=MODEL, input="go", tools=TOOLS)
    streamed = list(client.responses.create(model=MODEL, input="go", tools=TOOLS, stream=True))
    done = [e.item for e in streamed if e.type == "response.output_item.done"]
    assert whole.output_text == "Let me look.\n" == streamed[-1].response.output_text
    assert [e.output_index for e in streamed if e.type == "response.output_item.added"] == [0, 1, 2]
    for items in (whole.output[1:], done[1:]):
        assert [(i.type, i.namespace, i.name) for i in items] == [("function_call", "multi_agent_v1", "spawn_agent"),
                                                                  ("function_call", None, "github.open")]
        assert [json.loads(i.arguments) for i in items] == [{"task": "tests"}, {"title": "bug"}]
        assert all(i.call_id.startswith("call_") and i.status == "completed" for i in items)
    arguments = [e.arguments for e in streamed if e.type == "response.function_call_arguments.done"]
    assert arguments == [i.arguments for i in done[1:]] and streamed[-1].type == "response.completed"


def test_calls_and_their_outputs_over_several_turns_render_as_in_chat_and_reuse_the_cache(server, client):
    script(server, call("read_file", path="a.py"), call("multi_agent_v1__spawn_agent", task="b"), "Done.")
    history, replies = [{"role": "user", "content": [{"type": "input_text", "text": "Fix a.py"}]}], []
    for turn in range(3):
        reply = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=history, tools=TOOLS)
        replies.append(reply)
        history += [item.model_dump(exclude_none=True) for item in reply.output]
        history += [{"type": "function_call_output", "call_id": i.call_id, "output": f"out {turn}"}
                    for i in reply.output if i.type == "function_call"]
    assert [r.output[0].type for r in replies] == ["function_call", "function_call", "message"]
    assert replies[-1].output_text == "Done."
    for earlier, later in zip(replies, replies[1:]):
        assert later.usage.input_tokens_details.cached_tokens >= earlier.usage.input_tokens - 16
    chat_tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                  for t in (READ_FILE, {**NAMESPACE["tools"][0], "name": "multi_agent_v1__spawn_agent",
                                        "description": "Sub-agents.\n\nStart one."}, {**DOTTED, "name": "github_open"})]
    calls = [(r.output[0].call_id, r.output[0].name if r is replies[0] else "multi_agent_v1__spawn_agent",
              r.output[0].arguments) for r in replies[:2]]
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": "Fix a.py"}]
    for turn, (call_id, name, arguments) in enumerate(calls):
        messages += [{"role": "assistant", "tool_calls": [{"id": call_id, "type": "function",
                                                           "function": {"name": name, "arguments": arguments}}]},
                     {"role": "tool", "tool_call_id": call_id, "content": f"out {turn}"}]
    script(server, "Done.")
    chat = client.chat.completions.create(model=MODEL, messages=messages, tools=chat_tools)
    assert chat.usage.prompt_tokens == replies[-1].usage.input_tokens


def test_forced_tool_choices_make_the_model_write_a_call(server, client):
    script(server, 'read_file", "arguments": {"path": "a.py"}}\n</tool_call>', '{"task": "t"}}\n</tool_call>')
    required = client.responses.create(model=MODEL, input="go", tools=TOOLS, tool_choice="required")
    named = client.responses.create(model=MODEL, input="go", tools=TOOLS,
                                    tool_choice={"type": "function", "name": "spawn_agent",
                                                 "namespace": "multi_agent_v1"})
    assert [(i.name, json.loads(i.arguments)) for i in required.output] == [("read_file", {"path": "a.py"})]
    assert [(i.namespace, i.name, json.loads(i.arguments)) for i in named.output] == [
        ("multi_agent_v1", "spawn_agent", {"task": "t"})]
    assert named.usage.output_tokens == len(tiny_tokenizer().encode('{"task": "t"}}\n</tool_call>')) + 1


def test_max_output_tokens_cuts_the_reply_and_ends_incomplete(server, client):
    script(server, "A long reply that does not fit.")
    cut = client.responses.create(model=MODEL, input="hi", max_output_tokens=4)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 4 and cut.output[0].status == "incomplete"
    events = list(client.responses.create(model=MODEL, input="hi", max_output_tokens=4, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == cut.output_text


def test_max_output_tokens_beyond_what_fits_is_clamped_to_the_pool(model_dir):
    with ServerThread(start_engine(model_dir, kv_budget_tokens=SMALL_POOL, block_size=16)) as small:
        reply = small.client().responses.create(model=MODEL, input="hi", max_output_tokens=10**6, **GREEDY)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.total_tokens == SMALL_POOL


@pytest.mark.parametrize("options, message", [
    ({"previous_response_id": "resp_1"}, "stores no responses; send the whole conversation in input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "text only"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "'item_reference' are not supported"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": TOOLS}, "not among the tools"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "only 'text'"),
])
def test_what_this_server_cannot_do_is_a_clear_400(client, options, message):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, **{"input": "hi", **options})
    assert message in refused.value.message


def test_the_same_conversation_gives_the_same_greedy_tokens_and_cache_as_chat_completions(client):
    call_item = {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": '{"path": "a.py"}'}
    items = [{"role": "developer", "content": INSTRUCTIONS}, {"role": "user", "content": "Fix a.py"}, call_item,
             {"type": "function_call_output", "call_id": "call_1", "output": "x = 1"}]
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": "Fix a.py"},
                {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "read_file", "arguments": '{"path": "a.py"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "x = 1"}]
    tools = TINY_HARNESS["tools"][:1]
    client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=8, **GREEDY)
    reply = client.responses.create(model=MODEL, input=items, tools=[READ_FILE], max_output_tokens=8, **GREEDY)
    chat = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=8, **GREEDY)
    assert reply.output_text == (chat.choices[0].message.content or "")
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (chat.usage.prompt_tokens,
                                                                     chat.usage.completion_tokens)
    assert reply.usage.input_tokens_details.cached_tokens == chat.usage.prompt_tokens_details.cached_tokens > 0


def test_codexs_first_request_becomes_its_messages_and_flattened_tools():
    body = json.loads(CODEX_REQUEST.read_text())
    inputs = chat_inputs_from_body(body)
    assert [m.role for m in inputs.messages] == ["developer", "developer", "user", "user"]
    names = [t["function"]["name"] for t in inputs.tools]
    assert "multi_agent_v1__spawn_agent" in names and "exec_command" in names
    namespaced = sum(len(t["tools"]) for t in body["tools"] if t["type"] == "namespace")
    plain = sum(t["type"] == "function" for t in body["tools"])
    assert len(names) == namespaced + plain and inputs.tool_choice == "auto"
