"""A stand-in for a harness CLI (Claude Code, Codex, aider ...), for the tests of `swarm run` with an
external harness. It talks to the server through the official SDKs, the way those CLIs do:

    python tests/helpers/fake_harness.py --api anthropic|openai-responses|openai-chat \\
        --base-url URL --api-key KEY --model M --task TEXT [--max-turns 4]

- its first request has a harness-style system text that ends with its cwd (as Claude Code's
  environment block does) and four tools with JSON schemas; every request streams;
- a tool call in the streamed reply is run (read_file and list_dir work, in the cwd; the others
  answer that they are not available) and its result goes back as the next turn: a tool_result
  block, a function_call_output item, or a tool message;
- it exits 0 after a reply without a call, or after --max-turns requests.

It prints one JSON line a turn on stdout, {"turn", "text", "calls": [{"name", "arguments"}]}, and
writes nothing else anywhere. With --spawn-child it calls no API: it starts three `sleep 300`s, one in
its process group, one in a session of its own (setsid), and one orphaned in a session of its own
(its parent exited), prints its pid and theirs on one line, and blocks; --ignore-sigterm makes the
whole tree ignore SIGTERM.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MAX_TOKENS = 256
TOOLS = [
    {"name": "read_file", "description": "Read a text file of the workspace.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "Relative path."}},
                    "required": ["path"]}},
    {"name": "list_dir", "description": "List a folder of the workspace.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "Relative path."}}}},
    {"name": "write_file", "description": "Write a text file of the workspace.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["path", "content"]}},
    {"name": "run_command", "description": "Run a shell command in the workspace.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
]
ORPHAN = ("import subprocess; print(subprocess.Popen(['sleep', '300'], start_new_session=True, "
          "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")


@dataclass(frozen=True, slots=True)
class Call:
    id: str
    name: str
    arguments: dict


def system_text(cwd: Path) -> str:
    return ("You are a fake coding agent, used in swarm's tests. Read the code before you change it, "
            "and call one tool at a time.\n\n"
            f"<env>\nPlatform: linux\nWorking directory: {cwd}\n</env>")


def run_tool(call: Call, cwd: Path) -> str:
    target = cwd / str(call.arguments.get("path", "."))
    try:
        if call.name == "read_file":
            return target.read_text(encoding="utf-8")
        if call.name == "list_dir":
            return "\n".join(sorted(entry.name for entry in target.iterdir()))
    except OSError as err:
        return f"error: {err}"
    return f"error: {call.name} is not available in the fake harness"


class AnthropicConversation:
    """Messages API, as Claude Code speaks it: system blocks, a bearer token, tool_result blocks."""

    def __init__(self, options: argparse.Namespace, cwd: Path):
        import anthropic
        self.client = anthropic.Anthropic(base_url=options.base_url, auth_token=options.api_key, max_retries=0)
        self.model = options.model
        self.system = [{"type": "text", "text": system_text(cwd), "cache_control": {"type": "ephemeral"}}]
        self.tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                      for t in TOOLS]
        self.messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": options.task}]}]

    def turn(self) -> tuple[str, list[Call]]:
        with self.client.messages.stream(model=self.model, max_tokens=MAX_TOKENS, system=self.system,
                                         tools=self.tools, messages=self.messages) as stream:
            reply = stream.get_final_message()
        self.messages.append({"role": "assistant",
                              "content": [block.model_dump(exclude_none=True) for block in reply.content]})
        text = "".join(block.text for block in reply.content if block.type == "text")
        return text, [Call(b.id, b.name, dict(b.input)) for b in reply.content if b.type == "tool_use"]

    def answer(self, results: list[tuple[Call, str]]) -> None:
        self.messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": output} for call, output in results]})


class ResponsesConversation:
    """Responses API, as Codex speaks it: instructions, input items, function_call_output items."""

    def __init__(self, options: argparse.Namespace, cwd: Path):
        import openai
        self.client = openai.OpenAI(base_url=options.base_url, api_key=options.api_key, max_retries=0)
        self.model = options.model
        self.instructions = system_text(cwd)
        self.tools = [{"type": "function", "strict": False, **tool} for tool in TOOLS]
        self.input: list[dict] = [{"role": "user", "content": [{"type": "input_text", "text": options.task}]}]

    def turn(self) -> tuple[str, list[Call]]:
        events = self.client.responses.create(model=self.model, instructions=self.instructions, input=self.input,
                                              tools=self.tools, stream=True, store=False)
        ended = ("response.completed", "response.incomplete")   # incomplete: the reply reached its token limit
        reply = next(event.response for event in events if event.type in ended)
        self.input += [item.model_dump(exclude_none=True) for item in reply.output]
        calls = [Call(item.call_id, item.name, json.loads(item.arguments or "{}"))
                 for item in reply.output if item.type == "function_call"]
        return reply.output_text, calls

    def answer(self, results: list[tuple[Call, str]]) -> None:
        self.input += [{"type": "function_call_output", "call_id": call.id, "output": output}
                       for call, output in results]


class ChatConversation:
    """Chat completions, as aider and OpenCode speak it: streamed deltas, tool messages."""

    def __init__(self, options: argparse.Namespace, cwd: Path):
        import openai
        self.client = openai.OpenAI(base_url=options.base_url, api_key=options.api_key, max_retries=0)
        self.model = options.model
        self.tools = [{"type": "function", "function": tool} for tool in TOOLS]
        self.messages: list[dict] = [{"role": "system", "content": system_text(cwd)},
                                     {"role": "user", "content": options.task}]

    def turn(self) -> tuple[str, list[Call]]:
        chunks = self.client.chat.completions.create(model=self.model, messages=self.messages, tools=self.tools,
                                                     max_tokens=MAX_TOKENS, stream=True)
        text, calls = _gather_chat_stream(chunks)
        message: dict = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]
        self.messages.append(message)
        return text, calls

    def answer(self, results: list[tuple[Call, str]]) -> None:
        self.messages += [{"role": "tool", "tool_call_id": call.id, "content": output} for call, output in results]


def _gather_chat_stream(chunks) -> tuple[str, list[Call]]:
    """The text and the calls of a streamed chat reply; a call's pieces come by index."""
    text, pieces = [], {}
    for chunk in chunks:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            for delta in choice.delta.tool_calls or []:
                piece = pieces.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                piece["id"] += delta.id or ""
                piece["name"] += (delta.function and delta.function.name) or ""
                piece["arguments"] += (delta.function and delta.function.arguments) or ""
    calls = [Call(p["id"], p["name"], json.loads(p["arguments"] or "{}")) for _, p in sorted(pieces.items())]
    return "".join(text), calls


CONVERSATIONS = {"anthropic": AnthropicConversation, "openai-responses": ResponsesConversation,
                 "openai-chat": ChatConversation}


def converse(options: argparse.Namespace) -> None:
    cwd = Path.cwd()
    conversation = CONVERSATIONS[options.api](options, cwd)
    for turn in range(1, options.max_turns + 1):
        text, calls = conversation.turn()
        print(json.dumps({"turn": turn, "text": text, "calls": [{"name": c.name, "arguments": c.arguments}
                                                                for c in calls]}), flush=True)
        if not calls:
            return
        conversation.answer([(call, run_tool(call, cwd)) for call in calls])


def spawn_children_and_block(ignore_sigterm: bool) -> None:
    if ignore_sigterm:  # inherited through fork and exec: the sleeps ignore it too
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    in_group = subprocess.Popen(["sleep", "300"])
    own_session = subprocess.Popen(["sleep", "300"], start_new_session=True)
    orphan = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True, check=True).stdout
    print(os.getpid(), in_group.pid, own_session.pid, int(orphan), flush=True)
    while True:
        signal.pause()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=sorted(CONVERSATIONS))
    parser.add_argument("--base-url")
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--task", default="Fix the bug in a.py.")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--spawn-child", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    options = parser.parse_args(argv)
    if not options.spawn_child and not (options.api and options.base_url):
        parser.error("--api and --base-url are needed (or --spawn-child)")
    return options


def main(argv: list[str]) -> None:
    options = parse(argv)
    if options.spawn_child:
        spawn_children_and_block(options.ignore_sigterm)
    converse(options)


if __name__ == "__main__":
    main(sys.argv[1:])
