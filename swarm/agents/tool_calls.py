"""Parse tool calls out of a model's generated text.

Two forms are understood:

    Hermes/Qwen  prose <tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>
    bare JSON    the whole reply is {"name": ..., "arguments": ...} ("parameters" also works),
                 optionally inside a ```json fence

Servers with a tool parser (vLLM, SGLang, swarm serve) send calls apart from the text, as
OpenAI `tool_calls`; `parse_structured_call` checks those the same way.

Anything else is content: a reply of prose without a call is the model's final answer.
A malformed call never raises; it becomes a message in `ParseResult.errors`, written for the
model so it can fix the call on its next turn.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

CALL_FORMAT = '<tool_call>{"name": "<tool name>", "arguments": {"<argument>": <value>}}</tool_call>'

# A missing </tool_call> is tolerated: the call then runs to the next <tool_call> or the end.
_TAGGED_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)
_FENCE = re.compile(r"\A```[a-zA-Z]*[ \t]*\n?(.*?)\n?```\Z", re.DOTALL)


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: dict
    raw: str


@dataclass(slots=True)
class ParseResult:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    content: str = ""


class MalformedCall(ValueError):
    """A call the model meant to make but wrote wrongly; the message says what is wrong."""


def parse_tool_calls(text: str) -> ParseResult:
    if "<tool_call>" in text:
        return _parse_tagged(text)
    return _parse_bare(text)


def parse_structured_call(name: str, arguments: str, number: int = 1) -> ParseResult:
    """A call a server already took out of the text (an OpenAI `tool_calls` entry): its name and
    its arguments as a JSON string. One call, or one error in the same words as a text call's."""
    raw = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    try:
        return ParseResult(calls=[_call_from_object({"name": name, "arguments": arguments}, raw)])
    except MalformedCall as err:
        return ParseResult(errors=[_error_message(number, f"{name} {arguments}", err)])


def _parse_tagged(text: str) -> ParseResult:
    result = ParseResult(content=_TAGGED_CALL.sub("", text).strip())
    for number, match in enumerate(_TAGGED_CALL.finditer(text), start=1):
        try:
            result.calls.append(_call_from_json(match.group(1), raw=match.group(0)))
        except MalformedCall as err:
            result.errors.append(_error_message(number, match.group(1), err))
    return result


def _parse_bare(text: str) -> ParseResult:
    body = _unfence(text.strip())
    if not body.startswith("{"):
        return ParseResult(content=text.strip())
    try:
        obj = _decode_object(body)
        if not _has_call_shape(obj):
            return ParseResult(content=text.strip())
        return ParseResult(calls=[_call_from_object(obj, raw=text.strip())])
    except MalformedCall as err:
        if not _looks_like_call(body):
            return ParseResult(content=text.strip())
        return ParseResult(errors=[_error_message(1, body, err)])


def _call_from_json(body: str, raw: str) -> ToolCall:
    return _call_from_object(_decode_object(_unfence(body.strip())), raw)


def _call_from_object(obj: dict, raw: str) -> ToolCall:
    if "name" not in obj and isinstance(obj.get("function"), dict):
        obj = obj["function"]  # the OpenAI shape {"type": "function", "function": {...}}
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise MalformedCall('it has no "name" string saying which tool to run')
    arguments = obj.get("arguments", obj.get("parameters"))
    return ToolCall(name=name.strip(), arguments=_decode_arguments(name, arguments), raw=raw)


def _decode_arguments(name: str, arguments: object) -> dict:
    if isinstance(arguments, str):
        arguments = _decode_json(arguments, what='"arguments" string') if arguments.strip() else None
    if arguments is None:
        return {}
    if not isinstance(arguments, dict):
        raise MalformedCall(f'the "arguments" of {name} must be a JSON object, not {_json_kind(arguments)}')
    return arguments


def _decode_object(body: str) -> dict:
    obj = _decode_json(body, what="JSON")
    if not isinstance(obj, dict):
        raise MalformedCall(f"it is {_json_kind(obj)}, not a JSON object")
    return obj


def _decode_json(body: str, what: str) -> object:
    body = body.strip()
    if not body:
        raise MalformedCall(f"its {what} is empty")
    try:
        obj, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as err:
        raise MalformedCall(f"its {what} is invalid ({err.msg} at line {err.lineno} column {err.colno})") from None
    # Small models often close one brace too many; anything else after the object is an error.
    if body[end:].strip().strip("}"):
        raise MalformedCall(f"there is extra text after the {what}: {_snippet(body[end:])}")
    return obj


def _unfence(text: str) -> str:
    match = _FENCE.match(text)
    return match.group(1).strip() if match else text


def _has_call_shape(obj: dict) -> bool:
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    return isinstance(obj.get("name"), str) and ("arguments" in obj or "parameters" in obj)


def _looks_like_call(body: str) -> bool:
    return '"name"' in body and ('"arguments"' in body or '"parameters"' in body)


def _error_message(number: int, body: str, err: MalformedCall) -> str:
    return (f"tool call {number} ({_snippet(body)}) was not run: {err}. "
            f"Write each call as {CALL_FORMAT} with valid JSON.")


def _snippet(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _json_kind(value: object) -> str:
    kinds = {str: "a string", bool: "a boolean", int: "a number", float: "a number",
             list: "a list", dict: "an object", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)
