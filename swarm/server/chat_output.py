"""Generated tokens out: text as soon as it is safe to send, and tool calls as OpenAI objects.

    generated:  Let me look. <tool_call>{"name": "read_file", ...}</tool_call>
                ^ streamed   ^ held back from the first possible call on; parsed at the end

Held back while streaming, so nothing sent ever has to be taken back:
  - an incomplete UTF-8 character at the end (it decodes as U+FFFD until its last byte comes);
  - a tail that may be the start of a stop string (the text is cut where a stop string begins);
  - when tools were offered, whatever may be a call: from `<tool_call>` (or a start of it at
    the end) on, or the whole reply while it may still be a bare JSON call (`{...`, a fence).
Streamed or not, a reply gives the same content and the same calls (`finish`).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from engine import Tokenizer
from swarm.agents.tool_calls import ToolCall, parse_tool_calls

CALL_TAG = "<tool_call>"


@dataclass(slots=True)
class ChatOutput:
    content: str | None
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI objects


class OutputText:
    def __init__(self, tokenizer: Tokenizer, stop: list[str], tool_calls: bool):
        self.tokenizer = tokenizer
        self.stop = stop
        self.tool_calls = tool_calls
        self.token_ids: list[int] = []
        self.sent = ""

    def add(self, token_ids: list[int]) -> str:
        """The text these tokens make safe to send (may be empty)."""
        self.token_ids += token_ids
        text = self.text()
        safe = text[:self._safe_length(text)]
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        piece, self.sent = safe[len(self.sent):], safe
        return piece

    def text(self) -> str:
        return cut_at_stop(self.tokenizer.decode(self.token_ids), self.stop)

    def finish(self) -> ChatOutput:
        """The whole reply: content (None when only calls) and the tool calls."""
        text = self.text()
        return split_tool_output(text) if self.tool_calls else ChatOutput(text)

    def unsent(self, output: ChatOutput) -> str:
        """The part of the final content not streamed yet."""
        content = output.content or ""
        return content[len(self.sent):] if content.startswith(self.sent) else ""

    def _safe_length(self, text: str) -> int:
        safe = len(text.rstrip("\ufffd"))
        safe = min(safe, len(text) - max((partial_suffix(text, s) for s in self.stop), default=0))
        if self.tool_calls:
            safe = min(safe, may_be_call_from(text))
        return safe


def cut_at_stop(text: str, stop: list[str]) -> str:
    cuts = [text.index(s) for s in stop if s in text]
    return text[:min(cuts)] if cuts else text


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


def may_be_call_from(text: str) -> int:
    """Where the text that may still turn out to be a tool call begins (len(text): nowhere)."""
    if not text.strip() or text.lstrip().startswith(("{", "`")):
        return 0
    index = text.find(CALL_TAG)
    if index >= 0:
        return index
    return len(text) - partial_suffix(text, CALL_TAG)


def call_start(text: str) -> int | None:
    index = text.find(CALL_TAG)
    if index >= 0:
        return index
    return 0 if text.lstrip().startswith(("{", "`")) else None


def split_tool_output(text: str) -> ChatOutput:
    """Content and calls; a reply whose calls do not all parse stays content, as written."""
    start = call_start(text)
    if start is None:
        return ChatOutput(text)
    parsed = parse_tool_calls(text[start:])
    if parsed.errors or not parsed.calls:
        return ChatOutput(text)
    content = text[:start] + parsed.content
    return ChatOutput(content if content.strip() else None, [openai_tool_call(c) for c in parsed.calls])


def openai_tool_call(call: ToolCall) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
