"""The OpenAI API's request shapes (the subset swarm serves) and its error body.

Fields swarm does not know are ignored, as vLLM does; fields it knows but cannot honour
(n > 1, logprobs, penalties) are refused with a 400 that names them.
"""
from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine import SamplingParams

GREEDY_BELOW = 1e-5
"""A temperature this small is greedy (as in vLLM): dividing by it would overflow the logits."""


class ApiError(Exception):
    """An error the client gets as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def utf8_text(text: str, param: str) -> str:
    """`text`, or a 400 when it holds what no tokenizer takes (an unpaired surrogate from JSON)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ApiError(400, f"the {param} contain text that is not valid Unicode ({err.reason} at "
                            f"character {err.start})", param=param) from None
    return text


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """pydantic's first error as one line a client can act on, and the parameter it names."""
    first = errors[0] if errors else {"msg": "invalid request", "loc": ()}
    loc = [str(part) for part in first.get("loc", ()) if part != "body" and not _union_branch(part)]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    if not loc:
        return f"the request body must be a JSON object ({first['msg']})", None
    param = ".".join(loc)
    return f"{param}: {first['msg']}", param


def _union_branch(part) -> bool:
    """pydantic names the branch of a union it tried (`str`, `list[int]`); not a field a client sent."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "dict", "list") or "[" in part)


def body_error(err: ValidationError, api: str) -> ApiError:
    """A body read outside a route (a captured request) that is not a valid `api` request."""
    message, param = validation_message(err.errors())
    return ApiError(400, f"not a valid {api} request: {message}", param=param)


def error_body(message: str, type: str, param: str | None = None, code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data):
        """Clients send `"temperature": null` for "not given"; the default then applies."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


class StreamOptions(_Request):
    include_usage: bool = False


class FunctionCall(_Request):
    name: str
    arguments: str = "{}"


class ToolCall(_Request):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(_Request):
    type: str
    text: str | None = None


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The content as one string; only text parts exist for a text model."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ApiError(400, f"content parts of type {part.type!r} are not supported; "
                                    "this server takes text only", param="messages")
        return "".join(part.text for part in self.content)


class GenerationRequest(_Request):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)  # what torch's generators take
    stop: Union[str, list[str], None] = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: Union[bool, int, None] = None
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def check_supported(self) -> None:
        if self.n != 1:
            raise ApiError(400, "n must be 1: this server returns one choice per request", param="n")
        if self.presence_penalty or self.frequency_penalty:
            param = "presence_penalty" if self.presence_penalty else "frequency_penalty"
            raise ApiError(400, f"{param} is not supported; leave it at 0", param=param)
        if self.logprobs:
            raise ApiError(400, "logprobs are not supported", param="logprobs")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed with stream: true", param="stream_options")

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        temperature = self.temperature if self.temperature >= GREEDY_BELOW else 0.0
        return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=self.top_p,
                              top_k=self.top_k, seed=self.seed, stop=self.stop_strings(),
                              ignore_eos=self.ignore_eos)


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict] | None = None
    tool_choice: Union[str, dict, None] = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens



class CompletionRequest(GenerationRequest):
    prompt: Union[str, list]   # text, token ids, or a list of one of them: see single_prompt
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo or self.suffix:
            param = "echo" if self.echo else "suffix"
            raise ApiError(400, f"{param} is not supported", param=param)

    def single_prompt(self) -> Union[str, list]:
        """The text, or the token ids as sent: the server checks them against its vocabulary."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(400, "send one prompt per request (a string or a list of token ids)",
                               param="prompt")
            prompt = prompt[0]
        if not prompt:
            raise ApiError(400, "the prompt is empty", param="prompt")
        return prompt
