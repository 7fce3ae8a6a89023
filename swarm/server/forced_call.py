"""A tool_choice that forces a call, in every API: the prompt ends with the start of the call, and the
model writes the rest of it (the reply is parsed with that start, which it does not count as generated).

    tool_choice, in chat's shape (each API converts its own)   the reply starts with
    None, "auto", "none"                                   ->  nothing
    "required"           (Anthropic any, Responses required)  ->  <tool_call>\\n{"name": "
    {"type": "function", "function": {"name": N}}          ->  <tool_call>\\n{"name": "N", "arguments":
                         (Anthropic tool, Responses function)

The start is the Hermes call that swarm's tools block asks every model for and that its parser reads.
"""
from __future__ import annotations

import json

from swarm.server.protocol import ApiError

CALL_START = '<tool_call>\n{"name": "'


def forced_call_start(tool_choice: str | dict | None, tools: list[dict] | None) -> str:
    """The text the reply must start with; ApiError(400) for a choice that names no offered tool."""
    if tool_choice in (None, "auto", "none"):
        return ""
    if not tools:
        raise ApiError(400, "tool_choice forces a tool call, but no tools were sent", param="tool_choice")
    if tool_choice == "required":
        return CALL_START
    name = _forced_name(tool_choice)
    if name not in {(tool.get("function") or {}).get("name") for tool in tools}:
        raise ApiError(400, f"tool_choice names the tool {name!r}, which is not among the tools sent",
                       param="tool_choice")
    return f'{CALL_START}{name}", "arguments": '


def _forced_name(tool_choice: str | dict) -> str:
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if isinstance(function, dict) and tool_choice.get("type") == "function" and isinstance(function.get("name"), str):
        return function["name"]
    raise ApiError(400, f"tool_choice {json.dumps(tool_choice)} is not supported; use 'auto', 'none', 'required' "
                        "or {\"type\": \"function\", \"function\": {\"name\": ...}}", param="tool_choice")
