"""Tool schemas in their canonical form, so the same tools always give the same trunk bytes.

Canonical means: the OpenAI function format `{"type": "function", "function": {...}}`,
every mapping's keys sorted, `required` lists sorted, tools ordered by name, and JSON
written with fixed separators. Key order, whitespace and tool order in the source
files therefore never reach the prompt.
"""
from __future__ import annotations

import json
import re

SEPARATORS = (", ", ": ")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


def normalize_tool(tool) -> dict:
    """The canonical form of one tool; ValueError says what is wrong with it."""
    if not isinstance(tool, dict):
        raise ValueError("a tool must be a mapping in the OpenAI function format")
    function = tool.get("function") if "function" in tool else tool
    if "function" in tool and set(tool) - {"type", "function"}:
        raise ValueError(f"unexpected keys {sorted(set(tool) - {'type', 'function'})} beside 'function'")
    if tool.get("type", "function") != "function":
        raise ValueError(f"type must be 'function', got {tool.get('type')!r}")
    if not isinstance(function, dict):
        raise ValueError("'function' must be a mapping with name, description and parameters")
    _check_function(function)
    return {"function": _canonical(function), "type": "function"}


def canonical_tools(tools: list) -> list[dict]:
    """Normalized and sorted by name; ValueError on a duplicate name."""
    normalized = sorted((normalize_tool(t) for t in tools), key=tool_name)
    names = [tool_name(t) for t in normalized]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"tool {duplicates[0]!r} is defined twice")
    return normalized


def tool_name(tool: dict) -> str:
    return tool["function"]["name"]


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=SEPARATORS, ensure_ascii=False)


def _check_function(function: dict) -> None:
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'")
    unknown = set(function) - _FUNCTION_KEYS
    if unknown:
        raise ValueError(f"tool {name!r}: unknown keys {sorted(unknown)}; "
                         f"allowed: {', '.join(sorted(_FUNCTION_KEYS))}")
    if not isinstance(function.get("description", ""), str):
        raise ValueError(f"tool {name!r}: description must be a string")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise ValueError(f"tool {name!r}: parameters must be a JSON schema with type 'object'")


def _canonical(value):
    if isinstance(value, dict):
        return {key: _canonical_entry(key, value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    return value


def _canonical_entry(key: str, value):
    if key == "required" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return sorted(value)
    return _canonical(value)
