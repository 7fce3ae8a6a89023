"""Tool calls through `swarm serve`: tools rendered the canonical way, calls parsed out of the
reply (whole and streamed), and a conversation with calls and results rendered back in."""
import json

from engine import EngineOptions
from engine.loading.tokenizer import Tokenizer
from swarm.server.chat_output import OutputText, split_tool_output
from swarm.server.chat_prompt import ChatPrompter
from swarm.server.protocol import ChatMessage
from swarm.trunk.canonical import tools_block
from tests.helpers.chat_templates import QWEN_TOOLS
from tests.helpers.runs import TINY_HARNESS, tiny_tokenizer
from tests.helpers.serving import MODEL, script

TOOLS = TINY_HARNESS["tools"]
READ_CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
WRITE_CALL = '<tool_call>\n{"name": "write_file", "arguments": {"path": "b.py", "content": "x = 1"}}\n</tool_call>'
SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "Fix a.py"}


def messages(*items) -> list[ChatMessage]:
    return [ChatMessage.model_validate(item) for item in items]


def test_tool_order_does_not_change_the_prompt_and_the_tools_block_starts_the_system_message():
    tokenizer = tiny_tokenizer()
    prompter = ChatPrompter(tokenizer)
    forward = prompter.build(messages(SYSTEM, USER), TOOLS)
    backward = prompter.build(messages(SYSTEM, USER), list(reversed(TOOLS)))
    assert forward.token_ids == backward.token_ids and forward.parse_tool_calls
    expected = tokenizer.apply_chat_template(
        [{"role": "system", "content": f"{tools_block(forward.tools)}\n\nYou are a coding agent."}, USER])
    assert forward.token_ids == tokenizer.encode(expected)
    assert [t["function"]["name"] for t in forward.tools] == ["read_file", "write_file"]


def test_without_a_system_message_the_tools_get_one_and_tool_choice_none_parses_nothing():
    tokenizer = tiny_tokenizer()
    prompt = ChatPrompter(tokenizer).build(messages(USER), TOOLS, tool_choice="none")
    expected = tokenizer.apply_chat_template([{"role": "system", "content": tools_block(prompt.tools)}, USER])
    assert prompt.token_ids == tokenizer.encode(expected) and not prompt.parse_tool_calls


def test_calls_and_results_render_back_as_hermes_text():
    tokenizer = tiny_tokenizer()
    call = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
    history = messages(SYSTEM, USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "x = 1"},
                       {"role": "tool", "tool_call_id": "call_2", "content": "y = 2"})
    prompt = ChatPrompter(tokenizer).build(history, TOOLS)
    text = tokenizer.decode(prompt.token_ids, skip_special_tokens=False)
    assert text.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n'
                         "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nx = 1\n</tool_response>\n"
                         "<tool_response>\ny = 2\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_a_template_that_knows_tools_renders_them_itself():
    base = tiny_tokenizer()
    tokenizer = Tokenizer(base.backend, QWEN_TOOLS, bos_token="<s>", eos_token="<|im_end|>")
    text = tokenizer.decode(ChatPrompter(tokenizer).build(messages(SYSTEM, USER), TOOLS).token_ids,
                            skip_special_tokens=False)
    assert text.count("# Tools") == 1 and text.index('"read_file"') < text.index('"write_file"')
    assert text.startswith("<|im_start|>system\n# Tools")
    assert "</tool_call>\n\nYou are a coding agent.<|im_end|>\n<|im_start|>user\nFix a.py" in text


def test_streamed_text_holds_back_what_may_still_become_a_call_or_a_stop_string():
    tokenizer = tiny_tokenizer()
    reply = f"Let me look. {READ_CALL}"
    output = OutputText(tokenizer, stop=[], tool_calls=True)
    pieces = [output.add([token]) for token in tokenizer.encode(reply)]
    assert "".join(pieces) == "Let me look. " and not any("<" in p for p in pieces)
    final = output.finish()
    assert final.content == "Let me look. " and output.unsent(final) == ""
    assert [c["function"]["name"] for c in final.tool_calls] == ["read_file"]

    stopping = OutputText(tokenizer, stop=["END"], tool_calls=False)
    pieces = [stopping.add([token]) for token in tokenizer.encode("abc EN")]
    assert "".join(pieces) == "abc " and stopping.finish().content == "abc EN"
    utf8 = OutputText(tokenizer, stop=[], tool_calls=False)
    assert [utf8.add([token]) for token in tokenizer.encode("é")] == ["", "é"]


def test_only_calls_that_all_parse_become_tool_calls():
    assert split_tool_output("plain answer").tool_calls == []
    bad = f"{READ_CALL}<tool_call>{{\"name\": \"write_file\", \"arguments\": [1]}}</tool_call>"
    assert split_tool_output(bad).content == bad and split_tool_output(bad).tool_calls == []
    bare = split_tool_output('{"name": "read_file", "arguments": {"path": "a.py"}}')
    assert bare.content is None and json.loads(bare.tool_calls[0]["function"]["arguments"]) == {"path": "a.py"}


def test_a_reply_with_calls_comes_back_as_tool_calls(server):
    script(server, f"Let me look.\n{READ_CALL}\n{WRITE_CALL}")
    reply = server.client().chat.completions.create(model=MODEL, messages=[SYSTEM, USER], tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look.\n"
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["read_file", "write_file"]
    assert json.loads(calls[1].function.arguments) == {"path": "b.py", "content": "x = 1"}
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    assert len({c.id for c in calls}) == 2


def test_streamed_calls_come_as_tool_call_deltas_after_the_prose(server):
    script(server, READ_CALL, f"Let me look.\n{READ_CALL}\n{WRITE_CALL}")
    client = server.client()
    client.chat.completions.create(model=MODEL, messages=[SYSTEM, USER], tools=TOOLS)   # caches the prompt's blocks
    chunks = list(client.chat.completions.create(model=MODEL, messages=[SYSTEM, USER], tools=TOOLS,
                                                 stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    content = [d.content for d in deltas if d.content]
    assert "".join(content) == "Let me look.\n" and not any("<" in piece for piece in content)
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert [(c.index, c.function.name) for c in calls] == [(0, "read_file"), (1, "write_file")]
    assert json.loads(calls[0].function.arguments) == {"path": "a.py"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    usage, block = chunks[-1].usage, EngineOptions().block_size
    whole_blocks = (usage.prompt_tokens - 1) // block * block   # the last token is always computed
    assert whole_blocks <= usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


def test_a_malformed_call_or_tool_choice_none_leaves_the_text_as_content(server):
    broken = '<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>'
    script(server, broken, READ_CALL, READ_CALL)
    client = server.client()
    malformed = client.chat.completions.create(model=MODEL, messages=[SYSTEM, USER], tools=TOOLS).choices[0]
    refused = client.chat.completions.create(model=MODEL, messages=[SYSTEM, USER], tools=TOOLS,
                                             tool_choice="none").choices[0]
    no_tools = client.chat.completions.create(model=MODEL, messages=[SYSTEM, USER]).choices[0]
    assert (malformed.message.content, malformed.finish_reason, malformed.message.tool_calls) == (broken, "stop", None)
    assert refused.message.content == READ_CALL and refused.finish_reason == "stop"
    assert no_tools.message.content == READ_CALL and no_tools.message.tool_calls is None


def test_the_next_turn_sends_the_call_and_its_result_back_and_reuses_the_first_turns_cache(server):
    script(server, READ_CALL, "Fixed.")
    client = server.client()
    first = client.chat.completions.create(model=MODEL, messages=[SYSTEM, USER], tools=list(reversed(TOOLS)))
    call = first.choices[0].message.tool_calls[0]
    history = [SYSTEM, USER, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "x = 1"}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    assert second.choices[0].message.content == "Fixed." and second.choices[0].finish_reason == "stop"
    tokenizer = tiny_tokenizer()
    system = {"role": "system", "content": f"{tools_block(TOOLS)}\n\nYou are a coding agent."}
    expected = tokenizer.apply_chat_template([system, USER, {"role": "assistant", "content": READ_CALL},
                                              {"role": "user", "content": "<tool_response>\nx = 1\n</tool_response>"}])
    assert second.usage.prompt_tokens == len(tokenizer.encode(expected))
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_metrics_count_replies_with_calls_under_tool_calls(server):
    """One reply ends at EOS, one at max_tokens: both are tool calls to the client and to /metrics."""
    calls = len(server.async_engine.engine.tokenizer.encode(READ_CALL))
    script(server, READ_CALL)
    client = server.client()
    reasons = ("stop", "length", "tool_calls")
    before = server.metrics()
    whole = client.chat.completions.create(model=MODEL, messages=[SYSTEM, USER], tools=TOOLS)
    streamed = list(client.chat.completions.create(model=MODEL, messages=[SYSTEM, USER], tools=TOOLS,
                                                   max_tokens=calls, stream=True))
    after = server.metrics()
    assert whole.choices[0].finish_reason == "tool_calls"
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "tool_calls"
    counted = {reason: after.get(f'swarm_requests_total{{finish_reason="{reason}"}}', 0)
               - before.get(f'swarm_requests_total{{finish_reason="{reason}"}}', 0) for reason in reasons}
    assert counted == {"stop": 0, "length": 0, "tool_calls": 2}
