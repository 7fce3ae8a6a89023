"""Anthropic's Messages API requests (the subset swarm serves), as the chat inputs every API renders alike.

    system: a string or text blocks           -> a system message (first)
    user: text / tool_result blocks, in order  -> user messages / tool messages
    assistant: text / tool_use blocks          -> an assistant message with tool_calls
    tools: {name, description, input_schema}   -> OpenAI function tools (made canonical when rendered)
    tool_choice: auto / any / tool / none      -> auto / required / {function: name} / none; any and
                                                  tool also start the reply with the call (forced_call.py)

So a conversation sent here renders to the same prompt ids as through /v1/chat/completions, and
shares its KV blocks. `cache_control`, `thinking` blocks and fields swarm does not know
(`thinking`, `metadata`, `context_management`, `output_config`, ...) are ignored: swarm's own
prefix cache serves every prompt. Errors here get Anthropic's body, `{"type": "error", "error": ...}`.
"""
from __future__ import annotations

import json
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine import SamplingParams
from swarm.server.generation import ChatInputs
from swarm.server.protocol import GREEDY_BELOW, ApiError, ChatMessage, ContentPart, body_error

IGNORED_BLOCKS = {"thinking", "redacted_thinking"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error", 529: "overloaded_error"}


def is_anthropic_request(path: str, headers) -> bool:
    """A request an Anthropic client sent: to /v1/messages*, or with the header its SDKs always send."""
    return path.startswith("/v1/messages") or "anthropic-version" in headers


def anthropic_error_body(status: int, message: str) -> dict:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentBlock(_Body):
    type: str
    text: str | None = None
    id: str | None = None                               # tool_use
    name: str | None = None
    input: dict | None = None
    tool_use_id: str | None = None                      # tool_result
    content: Union[str, list[ContentBlock], None] = None
    is_error: bool | None = None


class Message(_Body):
    role: Literal["user", "assistant", "system"]
    content: Union[str, list[ContentBlock]]


class Tool(_Body):
    name: str
    description: str | None = None
    input_schema: dict | None = None
    type: str | None = None


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class MessagesInput(_Body):
    """What /v1/messages/count_tokens takes, and the conversation of every /v1/messages request."""

    model: str
    messages: list[Message] = Field(min_length=1)
    system: Union[str, list[ContentBlock], None] = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None

    def check_supported(self) -> None:
        """Nothing to refuse beyond what converting finds; check_model calls it."""

    def chat_inputs(self) -> ChatInputs:
        system = [ChatMessage(role="system", content=_text_parts(self.system, "system"))] if self.system else []
        messages = [chat for i, message in enumerate(self.messages)
                    for chat in _chat_messages(message, f"messages.{i}")]
        tools = [_function_tool(tool, f"tools.{i}") for i, tool in enumerate(self.tools or [])]
        return ChatInputs(system + messages, tools or None, _tool_choice(self.tool_choice, tools))


class MessagesRequest(MessagesInput):
    """POST /v1/messages; it has the interface start_job asks of a request."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)   # null: not given, as everywhere here
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool | None = False

    @property
    def include_usage(self) -> bool:
        return False   # Anthropic's events always carry usage: nothing to ask for

    def requested_max_tokens(self) -> int:
        return self.max_tokens

    def stop_strings(self) -> list[str]:
        return [s for s in self.stop_sequences or [] if s]

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        temperature = 1.0 if self.temperature is None else self.temperature
        temperature = temperature if temperature >= GREEDY_BELOW else 0.0
        return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=self.top_p or 1.0,
                              top_k=self.top_k or 0, stop=self.stop_strings())


def chat_inputs_from_body(body: dict) -> ChatInputs:
    """A captured /v1/messages (or count_tokens) body as serve renders it; ApiError(400) when invalid."""
    try:
        return MessagesInput.model_validate(body).chat_inputs()
    except ValidationError as err:
        raise body_error(err, "Anthropic Messages") from None


def _chat_messages(message: Message, param: str) -> list[ChatMessage]:
    if isinstance(message.content, str):
        return [ChatMessage(role=message.role, content=message.content)]
    if message.role == "assistant":
        return [_assistant_message(message.content, param)]
    chats, texts = [], []
    for i, block in enumerate(message.content):
        if block.type == "tool_result":
            chats += [ChatMessage(role=message.role, content=texts)] if texts else []
            texts = []
            chats.append(ChatMessage(role="tool", tool_call_id=block.tool_use_id,
                                     content=_text_parts(block.content or "", f"{param}.content.{i}.content")))
        elif block.type not in IGNORED_BLOCKS:
            texts.append(_text_part(block, f"{param}.content.{i}"))
    return chats + ([ChatMessage(role=message.role, content=texts)] if texts else [])


def _assistant_message(blocks: list[ContentBlock], param: str) -> ChatMessage:
    texts, calls = [], []
    for i, block in enumerate(blocks):
        if block.type == "tool_use":
            if not block.name:
                raise ApiError(400, f"{param}.content.{i}: a tool_use block needs a name", param=param)
            arguments = json.dumps(block.input or {}, ensure_ascii=False)
            calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}})
        elif block.type not in IGNORED_BLOCKS:
            texts.append(_text_part(block, f"{param}.content.{i}"))
    return ChatMessage(role="assistant", content=texts, tool_calls=calls or None)


def _text_parts(content: str | list[ContentBlock], param: str) -> str | list[ContentPart]:
    if isinstance(content, str):
        return content
    return [_text_part(block, f"{param}.{i}") for i, block in enumerate(content)]


def _text_part(block: ContentBlock, param: str) -> ContentPart:
    if block.type != "text" or block.text is None:
        raise ApiError(400, f"{param}: content blocks of type {block.type!r} are not supported; this server "
                            "serves a text model and takes text, tool_use and tool_result blocks", param=param)
    return ContentPart(type="text", text=block.text)


def _function_tool(tool: Tool, param: str) -> dict:
    if tool.type not in (None, "custom"):
        raise ApiError(400, f"{param}: {tool.type!r} is a tool Anthropic's servers run; this server runs no "
                            "server tools: leave it out or describe it with an input_schema", param=param)
    function = {"name": tool.name, "parameters": tool.input_schema or {"type": "object", "properties": {}}}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _tool_choice(choice: ToolChoice | None, tools: list[dict]) -> str | dict | None:
    if choice is None or choice.type in ("auto", "none"):
        return choice and choice.type
    if choice.type == "any":
        return "required"
    if choice.name not in {tool["function"]["name"] for tool in tools}:
        raise ApiError(400, f"tool_choice: the tool {choice.name!r} is not among the tools sent", param="tool_choice")
    return {"type": "function", "function": {"name": choice.name}}
