"""Chat messages and tools in, prompt token ids out, rendered the way swarm renders a trunk.

    prompt ids = [ system message alone, tokenized alone ][ the rest, tokenized alone ]
                   tools canonical (sorted, canonical JSON),  users, assistants, tool results,
                   in the template's words or a Hermes tools  the generation prompt
                   block, then the system text

So every client that sends the same system prompt and tools, in any order, starts with the
same ids as the others, and as `swarm run`'s trunk for that harness: they share its KV blocks.
The tools come before the system text (swarm/trunk/tools_first.py), so clients whose system
texts differ in a volatile tail still share the whole tools block; with --canonicalize, what is
known to be volatile leaves the system text for the first user message (swarm/server/canonicalize.py).
Assistant tool calls go back in as `<tool_call>` text (or the template's own `tool_calls`),
tool results as the template's `tool` role or a user message of `<tool_response>` blocks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import jinja2

from engine import ModelLoadError, Tokenizer
from swarm.agents.tool_response import ToolResponseFormat
from swarm.server.protocol import ApiError, ChatMessage, utf8_text
from swarm.spec.tool_schema import canonical_json, canonical_tools
from swarm.trunk.canonical import system_content, tokenize_with_offsets
from swarm.trunk.tools_first import MARKER, ToolsFirst, tools_first_layout


@dataclass(slots=True)
class ChatPrompt:
    token_ids: list[int]
    tools: list[dict]            # canonical
    parse_tool_calls: bool       # tools were offered and tool_choice is not "none"


class ChatPrompter:
    def __init__(self, tokenizer: Tokenizer,
                 canonicalize: Callable[[list[ChatMessage]], list[ChatMessage]] | None = None):
        """`canonicalize`: what --canonicalize does to a request's messages before they are rendered."""
        self.tokenizer = tokenizer
        self.canonicalize = canonicalize
        self.responses = ToolResponseFormat(tokenizer)
        self._layouts: dict[str, ToolsFirst | None] = {}

    def build(self, messages: list[ChatMessage], tools: list[dict] | None = None,
              tool_choice: str | dict | None = None) -> ChatPrompt:
        canonical = self._canonical(tools or [])
        if self.canonicalize is not None:
            messages = self.canonicalize(messages)
        layout = self._layout(canonical)
        mode = "chat-template" if layout else "tools-block" if canonical else "none"
        dicts = self._message_dicts(messages, canonical, mode)
        ids = self._tokenize(dicts, canonical, layout)
        return ChatPrompt(ids, canonical, bool(canonical) and tool_choice != "none")

    def _canonical(self, tools: list[dict]) -> list[dict]:
        try:
            return canonical_tools(tools)
        except ValueError as err:
            raise ApiError(400, f"tools: {err}", param="tools") from None

    def _layout(self, tools: list[dict]) -> ToolsFirst | None:
        """Where the template writes these tools, so they go before the system text; None: a
        Hermes tools block (or no tools). The same choice as `tools_mode` makes for a trunk."""
        if not tools or not self.tokenizer.supports_tools:
            return None
        key = canonical_json(tools)
        if key not in self._layouts:
            self._layouts[key] = tools_first_layout(self.tokenizer, tools)
        return self._layouts[key]

    def _message_dicts(self, messages: list[ChatMessage], tools: list[dict], mode: str) -> list[dict]:
        dicts, results = [], []
        for message in messages:
            if message.role == "tool":
                results.append(message.text())
                continue
            if results:
                dicts += self.responses.messages(results)
                results = []
            dicts.append(self._message_dict(message, mode))
        dicts += self.responses.messages(results) if results else []
        if mode == "tools-block":
            _add_tools_block(dicts, tools)
        elif mode == "chat-template" and (not dicts or dicts[0]["role"] != "system"):
            dicts.insert(0, {"role": "system", "content": ""})
        return dicts

    def _message_dict(self, message: ChatMessage, mode: str) -> dict:
        role = "system" if message.role == "developer" else message.role
        text = message.text()
        if role != "assistant" or not message.tool_calls:
            return {"role": role, "content": text}
        calls = [{"name": c.function.name, "arguments": _arguments(c.function.arguments)}
                 for c in message.tool_calls]
        if mode == "chat-template":
            return {"role": role, "content": text,
                    "tool_calls": [{"type": "function", "function": call} for call in calls]}
        written = "\n".join(f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>" for call in calls)
        return {"role": role, "content": f"{text}\n{written}" if text else written}

    def _tokenize(self, messages: list[dict], tools: list[dict], layout: ToolsFirst | None) -> list[int]:
        """The system message alone, then the rest, as the trunk is tokenized."""
        full = utf8_text(self._text(messages, tools, layout, add_generation_prompt=True), "messages")
        if messages[0]["role"] == "system":
            system = self._text(messages[:1], tools, layout, add_generation_prompt=False)
            if full.startswith(system):
                head, _ = tokenize_with_offsets(self.tokenizer, system, first=True)
                tail, _ = tokenize_with_offsets(self.tokenizer, full[len(system):], first=False)
                return head + tail
        ids, _ = tokenize_with_offsets(self.tokenizer, full, first=True)
        return ids

    def _text(self, messages: list[dict], tools: list[dict], layout: ToolsFirst | None,
              add_generation_prompt: bool) -> str:
        """The template's rendering; with a layout, of the tools and then the system text."""
        if layout is None:
            return self._render(messages, None, add_generation_prompt)
        marked = [{**messages[0], "content": MARKER}, *messages[1:]]
        return layout.place(self._render(marked, tools, add_generation_prompt), messages[0]["content"])

    def _render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tools=tools,
                                                      add_generation_prompt=add_generation_prompt)
        except ModelLoadError as err:
            raise ApiError(400, f"{err}; use /v1/completions", param="messages") from None
        except jinja2.TemplateError as err:
            raise ApiError(400, f"the model's chat template cannot render these messages: {err}",
                           param="messages") from None


def _add_tools_block(messages: list[dict], tools: list[dict]) -> None:
    """The tools go at the start of the system message, as in a trunk; one is added if missing."""
    if messages and messages[0]["role"] == "system":
        messages[0] = {**messages[0], "content": system_content(messages[0]["content"], tools, "tools-block")}
    else:
        messages.insert(0, {"role": "system", "content": system_content("", tools, "tools-block")})


def _arguments(raw: str) -> dict:
    try:
        value = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as err:
        raise ApiError(400, f"tool call arguments must be a JSON object string ({err.msg})",
                       param="messages") from None
    if not isinstance(value, dict):
        raise ApiError(400, "tool call arguments must be a JSON object string", param="messages")
    return value
