"""One conversation (a system text, tools, a call and its result) sent through all three APIs of `swarm
serve` with the official clients: the same prompt, the same greedy tokens and the same cached counts; and
a tool_choice that forces a call gives the same call in each."""
import json

import anthropic

from tests.helpers.runs import TINY_HARNESS, tiny_tokenizer
from tests.helpers.serving import MODEL, script

SYSTEM = "You are a coding agent."
READ = TINY_HARNESS["tools"][0]
ARGUMENTS = '{"path": "a.py"}'
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix a.py"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": ARGUMENTS}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "x = 1"}]
MESSAGES = [{"role": "user", "content": "Fix a.py"},
            {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, {
                "type": "tool_use", "id": "toolu_1", "name": "read_file", "input": json.loads(ARGUMENTS)}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x = 1"}]}]
ITEMS = [{"role": "user", "content": "Fix a.py"},
         {"role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
         {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": ARGUMENTS},
         {"type": "function_call_output", "call_id": "call_1", "output": "x = 1"}]
ANTHROPIC_TOOLS = [{"name": READ["function"]["name"], "description": READ["function"]["description"],
                    "input_schema": READ["function"]["parameters"]}]
RESPONSES_TOOLS = [{"type": "function", **READ["function"]}]


def three_replies(server, max_tokens: int, **choices) -> dict:
    """(text, prompt tokens, cached tokens, generated tokens, tool calls) of each API's reply."""
    openai_client = server.client()
    messages = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    chat = openai_client.chat.completions.create(model=MODEL, messages=CHAT, tools=[READ], max_tokens=max_tokens,
                                                 temperature=0, **choices.get("chat", {}))
    message = messages.messages.create(model=MODEL, system=SYSTEM, messages=MESSAGES, tools=ANTHROPIC_TOOLS,
                                       max_tokens=max_tokens, extra_body={"temperature": 0},
                                       **choices.get("messages", {}))
    response = openai_client.responses.create(model=MODEL, instructions=SYSTEM, input=ITEMS, tools=RESPONSES_TOOLS,
                                              max_output_tokens=max_tokens, temperature=0,
                                              **choices.get("responses", {}))
    choice = chat.choices[0].message
    return {
        "chat": (choice.content or "", chat.usage.prompt_tokens, chat.usage.prompt_tokens_details.cached_tokens,
                 chat.usage.completion_tokens,
                 [(c.function.name, c.function.arguments) for c in choice.tool_calls or []]),
        "messages": ("".join(b.text for b in message.content if b.type == "text"),
                     message.usage.input_tokens + message.usage.cache_read_input_tokens,
                     message.usage.cache_read_input_tokens, message.usage.output_tokens,
                     [(b.name, json.dumps(b.input)) for b in message.content if b.type == "tool_use"]),
        "responses": (response.output_text, response.usage.input_tokens,
                      response.usage.input_tokens_details.cached_tokens, response.usage.output_tokens,
                      [(i.name, i.arguments) for i in response.output if i.type == "function_call"]),
    }


def test_the_same_conversation_gives_the_same_tokens_and_cached_counts_in_every_api(server):
    three_replies(server, 1)   # the conversation's blocks are cached from here on, for all three alike
    replies = three_replies(server, 12)
    assert replies["messages"] == replies["chat"] == replies["responses"]
    text, prompt, cached, generated, calls = replies["chat"]
    assert cached > 0 and prompt > cached and generated > 0


def test_a_forced_call_of_one_tool_is_the_same_call_in_every_api(server):
    script(server, f"{ARGUMENTS}}}\n</tool_call>")   # what the model writes after the forced start
    forced = {"chat": {"tool_choice": {"type": "function", "function": {"name": "read_file"}}},
              "messages": {"tool_choice": {"type": "tool", "name": "read_file"}},
              "responses": {"tool_choice": {"type": "function", "name": "read_file"}}}
    three_replies(server, 1, **forced)
    replies = three_replies(server, 40, **forced)
    assert replies["messages"] == replies["chat"] == replies["responses"]
    text, prompt, cached, generated, calls = replies["chat"]
    rest = tiny_tokenizer().encode(f"{ARGUMENTS}}}\n</tool_call>")
    assert calls == [("read_file", ARGUMENTS)] and generated == len(rest) + 1   # and EOS
