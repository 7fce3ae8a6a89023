"""OpenAI's Responses API request (the subset swarm serves), converted to swarm's chat inputs.

    instructions                         -> a system message first
    input: "text"                        -> one user message
    input items:  message (developer/system/user/assistant; input_text/output_text parts)
                  function_call          -> the assistant's tool call (after its text, if any)
                  function_call_output   -> a tool result
                  reasoning              -> dropped: a text model has none to read back
    tools:        function               -> an OpenAI function tool
                  namespace {tools}      -> its functions, flattened (responses_tools.ToolNames)
                  web_search, custom ... -> not offered to the model (logged): Codex always sends
                                            a hosted web_search tool, and refusing would refuse Codex

Nothing is stored: `previous_response_id`, `conversation` and `background` are refused, and
`store: true` is accepted but stores nothing. Fields that change nothing here (reasoning, include,
truncation, metadata, prompt_cache_key, service_tier, ...) are accepted and ignored.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Union

from pydantic import Field, ValidationError

from swarm.server.generation import ChatInputs
from swarm.server.protocol import ApiError, ChatMessage, FunctionCall, GenerationRequest, ToolCall, _Request, body_error
from swarm.server.responses_tools import ToolNames, chat_tool_choice

log = logging.getLogger("swarm.serve")
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


class ContentPart(_Request):
    type: str
    text: str | None = None


class MessageItem(_Request):
    type: Literal["message"] = "message"
    role: Literal["developer", "system", "user", "assistant"]
    content: Union[str, list[ContentPart]]


class FunctionCallItem(_Request):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = "{}"
    namespace: str | None = None


class FunctionCallOutputItem(_Request):
    type: Literal["function_call_output"]
    call_id: str
    output: Union[str, list[ContentPart]]


ITEM_MODELS = {"message": MessageItem, "function_call": FunctionCallItem,
               "function_call_output": FunctionCallOutputItem}
SKIPPED_ITEMS = ("reasoning",)


@dataclass(slots=True)
class Conversation:
    """What the route needs beyond the chat inputs: the tool names' map back to the client's."""

    inputs: ChatInputs
    names: ToolNames


class ResponsesRequest(GenerationRequest):
    input: Union[str, list[dict]]
    instructions: str | None = None
    tools: list[dict] | None = None
    tool_choice: Union[str, dict, None] = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    previous_response_id: str | None = None
    conversation: Union[str, dict, None] = None
    background: bool = False
    store: bool | None = None
    text: dict | None = None
    metadata: dict | None = None
    truncation: str | None = None
    reasoning: dict | None = None
    include: list | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_output_tokens

    def check_supported(self) -> None:
        super().check_supported()
        stored = next((p for p in ("previous_response_id", "conversation") if getattr(self, p)), None)
        if stored:
            raise ApiError(400, f"{stored}: this server stores no responses; send the whole conversation in "
                                "input", param=stored)
        if self.background:
            raise ApiError(400, "background responses are not supported; leave background false",
                           param="background")
        text_format = (self.text or {}).get("format") or {"type": "text"}
        if text_format.get("type") != "text":
            raise ApiError(400, f"text.format {text_format.get('type')!r} is not supported; only 'text'",
                           param="text.format")

    def conversation_inputs(self) -> Conversation:
        names = ToolNames.of(self.tools or [])
        if names.ignored:
            log.info("tools not offered to the model (this server runs functions only): %s",
                     ", ".join(names.ignored))
        messages = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        messages += input_messages(self.input, names)
        if not messages:
            raise ApiError(400, "input is empty; send the conversation as a string or a list of items",
                           param="input")
        choice = chat_tool_choice(self.tool_choice, names)
        return Conversation(ChatInputs(messages, names.function_tools or None, choice), names)


def chat_inputs_from_body(body: dict) -> ChatInputs:
    """A raw /v1/responses body as the chat inputs serve renders (for inspect-prefix --requests)."""
    try:
        request = ResponsesRequest.model_validate(body)
    except ValidationError as err:
        raise body_error(err, "Responses API") from None
    return request.conversation_inputs().inputs


def input_messages(given: str | list[dict], names: ToolNames) -> list[ChatMessage]:
    if isinstance(given, str):
        return [ChatMessage(role="user", content=given)]
    messages: list[ChatMessage] = []
    for index, raw in enumerate(given):
        item = _parse_item(raw, index)
        if item is not None:
            _add_item(messages, item, names, index)
    return messages


def _parse_item(raw: dict, index: int):
    kind = raw.get("type", "message") if isinstance(raw, dict) else None
    if kind in SKIPPED_ITEMS:
        return None
    model = ITEM_MODELS.get(kind)
    if model is None:
        raise ApiError(400, f"input[{index}]: items of type {kind!r} are not supported; send messages, "
                            "function_call and function_call_output items", param=f"input[{index}]")
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ApiError(400, f"input[{index}].{where}: {first['msg']}", param=f"input[{index}]") from None


def _add_item(messages: list[ChatMessage], item, names: ToolNames, index: int) -> None:
    param = f"input[{index}]"
    if isinstance(item, MessageItem):
        messages.append(ChatMessage(role=item.role, content=_text(item.content, param)))
    elif isinstance(item, FunctionCallOutputItem):
        messages.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=_text(item.output, param)))
    else:
        call = ToolCall(id=item.call_id, function=FunctionCall(name=names.visible(item.namespace, item.name),
                                                               arguments=item.arguments))
        last = messages[-1] if messages else None
        if last is not None and last.role == "assistant":   # the text and calls of one reply
            last.tool_calls = [*(last.tool_calls or []), call]
        else:
            messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))


def _text(content: str | list[ContentPart], param: str) -> str:
    if isinstance(content, str):
        return content
    for part in content:
        if part.type not in TEXT_PARTS or part.text is None:
            raise ApiError(400, f"{param}: content parts of type {part.type!r} are not supported; this server "
                                "takes text only (input_text, output_text)", param=param)
    return "".join(part.text for part in content)
