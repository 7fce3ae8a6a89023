"""Request bodies a client sent (`swarm serve --capture DIR`, or saved by hand), read back and rendered
exactly as `swarm serve` renders them: the API's own converter, then the one ChatPrompter.

    DIR/000001-messages.json  (+ .meta.json)  -> CapturedRequest: api "messages", body
        -> chat_inputs_from_body(body)           anthropic_protocol / responses_protocol / openai_routes
        -> ChatPrompter.build(...)               -> RenderedRequest: prompt ids, system texts

The API is the sidecar's path where there is one; else the body's shape says it:
    `input` or `instructions`                                         OpenAI Responses
    `messages` with a top-level `system`, Anthropic content blocks
    (tool_use, tool_result) or tools with `input_schema`              Anthropic Messages
    `messages` otherwise                                              OpenAI chat completions
    `prompt`                                                          OpenAI completions: no chat to render
A body serve would refuse, or that renders no chat, is skipped with the reason; a file that is not
JSON, or a body of no API, is an error.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine import OptionError
from swarm.server import anthropic_protocol, openai_routes, responses_protocol
from swarm.server.capture import META_SUFFIX
from swarm.server.chat_prompt import ChatPrompter
from swarm.server.generation import ChatInputs
from swarm.server.protocol import ApiError
from swarm.trunk.request_prefix import RenderedRequest

CONVERTERS = {"chat.completions": openai_routes.chat_inputs_from_body,
              "messages": anthropic_protocol.chat_inputs_from_body,
              "responses": responses_protocol.chat_inputs_from_body}
ROUTE_APIS = {"/v1/chat/completions": "chat.completions", "/v1/completions": "completions",
              "/v1/messages": "messages", "/v1/messages/count_tokens": "messages", "/v1/responses": "responses"}
ANTHROPIC_BLOCKS = {"tool_use", "tool_result", "thinking", "redacted_thinking"}


@dataclass(slots=True)
class CapturedRequest:
    name: str
    path: Path
    api: str
    body: dict | None
    skip_reason: str | None = None


@dataclass(slots=True)
class SkippedRequest:
    name: str
    path: str
    api: str
    reason: str


def read_requests(paths: list[Path]) -> list[CapturedRequest]:
    """Every body in `paths` (files, or folders of them: their *.json files but the sidecars, in name order),
    each named by its file (and its folder, where two files have the same name)."""
    files = [file for path in paths for file in _body_files(path)]
    if not files:
        raise OptionError(f"no request bodies in {', '.join(map(str, paths)) or 'no paths'}; give captured "
                          "*.json files or the folder `swarm serve --capture` wrote them to")
    short = len({file.stem for file in files}) == len(files)
    return [_read(file, file.stem if short else f"{file.parent.name}/{file.stem}") for file in files]


def chat_inputs(request: CapturedRequest) -> ChatInputs:
    """The conversation as the API's route converts it; ApiError when serve would refuse the body."""
    return CONVERTERS[request.api](request.body)


def render(prompter: ChatPrompter, name: str, api: str, inputs: ChatInputs) -> RenderedRequest:
    """The prompt ids serve computes for `inputs`, and the system text the client sent."""
    prompt = prompter.build(inputs.messages, inputs.tools, inputs.tool_choice)
    return RenderedRequest(name, api, prompt.token_ids, _system_texts(inputs))


def render_all(prompter: ChatPrompter, requests: list[CapturedRequest]) -> tuple[
        list[tuple[CapturedRequest, ChatInputs, RenderedRequest]], list[SkippedRequest]]:
    """Each request rendered, or skipped with why (serve's own 400 message, or no chat to render)."""
    rendered, skipped = [], []
    for request in requests:
        if request.skip_reason is not None:
            skipped.append(SkippedRequest(request.name, str(request.path), request.api, request.skip_reason))
            continue
        try:
            inputs = chat_inputs(request)
            rendered.append((request, inputs, render(prompter, request.name, request.api, inputs)))
        except ApiError as err:
            skipped.append(SkippedRequest(request.name, str(request.path), request.api,
                                          f"serve refuses it with a {err.status}: {err.message}"))
    return rendered, skipped


def api_of(body: dict, route: str | None = None) -> str | None:
    """The API a body was sent to: its route where known, else its shape; None: no API swarm knows."""
    if route is not None:
        return ROUTE_APIS.get(route.rstrip("/"))
    if "input" in body or "instructions" in body:
        return "responses"
    if "prompt" in body:
        return "completions"
    if not isinstance(body.get("messages"), list):
        return None
    return "messages" if _anthropic_shaped(body) else "chat.completions"


def _anthropic_shaped(body: dict) -> bool:
    if "system" in body or any(isinstance(t, dict) and "input_schema" in t for t in body.get("tools") or []):
        return True
    blocks = [block for message in body["messages"] if isinstance(message, dict)
              and isinstance(message.get("content"), list) for block in message["content"]]
    return any(isinstance(block, dict) and block.get("type") in ANTHROPIC_BLOCKS for block in blocks)


def _body_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in (".json", ".body") and not p.name.endswith(META_SUFFIX))
    if not path.is_file():
        raise OptionError(f"{path}: no such file or folder")
    return [path]


def _read(file: Path, name: str) -> CapturedRequest:
    route = _route(file)
    if file.suffix == ".body":
        return CapturedRequest(name, file, ROUTE_APIS.get(route or "", "unknown"), None, "its body is not JSON")
    try:
        body = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as err:
        raise OptionError(f"{file}: not a JSON request body ({err})") from None
    if not isinstance(body, dict):
        raise OptionError(f"{file}: a request body is a JSON object, this is a {type(body).__name__}")
    api = api_of(body, route)
    if api is None and route is None:
        raise OptionError(f"{file}: not a request of an API swarm serves: it has no `messages` (chat completions, "
                          "Anthropic messages), `input` or `instructions` (OpenAI responses)")
    if api not in CONVERTERS:
        reason = f"POST {route} has no chat to render" if route else "a completions prompt has no chat to render"
        return CapturedRequest(name, file, api or "unknown", body, reason)
    return CapturedRequest(name, file, api, body)


def _route(file: Path) -> str | None:
    """The path the sidecar `swarm serve --capture` wrote beside the body says it was sent to."""
    meta = file.with_name(file.stem + META_SUFFIX)
    try:
        return json.loads(meta.read_text(encoding="utf-8"))["path"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _system_texts(inputs: ChatInputs) -> list[str]:
    """The system (or developer) messages the conversation starts with: where a trunk lives."""
    texts = []
    for message in inputs.messages:
        if message.role not in ("system", "developer"):
            break
        texts.append(message.text())
    return texts
