"""One chat turn against an OpenAI-compatible server (vLLM, SGLang, `swarm serve`), streamed.

A turn is one `POST <base_url>/chat/completions` with `stream: true` and
`stream_options: {include_usage: true}`: text and tool-call pieces arrive as they are
generated, the usage (prompt, completion and cached prompt tokens) with the last chunk.
Cancelling the task that awaits `stream_turn` closes the stream, which cancels the request
on the server. Every failure becomes a `RemoteError`: one line naming the server and what to fix.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable

import openai

from engine import SamplingParams, SwarmError
from swarm.spec.backend import BackendSpec

MAX_ERROR_CHARS = 240
CHECK_TIMEOUT_SECONDS = 30.0
_CONTEXT_FULL = re.compile(r"context length|context window|maximum context|prompt is too long", re.IGNORECASE)


class RemoteError(SwarmError):
    """The server could not be reached, refused the request, or failed it."""


class ContextFullError(RemoteError):
    """The conversation no longer fits the model's context on the server."""


@dataclass(slots=True)
class StreamedCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(slots=True)
class AssistantReply:
    """One turn's answer, filled in as the stream arrives (so a cancelled turn keeps its text)."""

    content: str = ""
    tool_calls: list[StreamedCall] = field(default_factory=list)
    finish_reason: str | None = None
    pieces: int = 0
    """Text and tool-call pieces received: about one per token, until the usage gives the count."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None

    @property
    def tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.pieces

    def message(self) -> dict:
        """The assistant message that goes back to the server with the next turn."""
        message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [{"id": call.id, "type": "function",
                                      "function": {"name": call.name, "arguments": call.arguments}}
                                     for call in self.tool_calls]
        return message

    def add_usage(self, usage) -> None:
        self.prompt_tokens, self.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        self.cached_tokens = cached if isinstance(cached, int) else None

    def add_delta(self, delta) -> int:
        """Appends one chunk's delta; returns the pieces it held."""
        pieces = 0
        if delta.content:
            self.content += delta.content
            pieces += 1
        for piece in delta.tool_calls or []:
            while len(self.tool_calls) <= piece.index:
                self.tool_calls.append(StreamedCall())
            call = self.tool_calls[piece.index]
            call.id = piece.id or call.id
            if piece.function is not None:
                call.name += piece.function.name or ""
                call.arguments += piece.function.arguments or ""
            pieces += 1
        self.pieces += pieces
        return pieces


def request_options(params: SamplingParams) -> dict:
    """A turn's sampling in the request's terms; top_k is not OpenAI's but vLLM and SGLang take it."""
    options = {"temperature": params.temperature, "top_p": params.top_p, "max_tokens": params.max_tokens}
    if params.seed is not None:
        options["seed"] = params.seed
    if params.top_k > 0:
        options["extra_body"] = {"top_k": params.top_k}
    return options


class ChatClient:
    def __init__(self, backend: BackendSpec, max_retries: int = 2):
        self.backend = backend
        self.openai = openai.AsyncOpenAI(base_url=backend.base_url, api_key=backend.api_key,
                                         max_retries=max_retries)

    async def check_model(self) -> None:
        """Fails fast, before any agent starts, when the server is down, refuses the key or lacks the model."""
        try:
            quick = self.openai.with_options(max_retries=0, timeout=CHECK_TIMEOUT_SECONDS)
            served = [model.id async for model in quick.models.list()]
        except openai.APIError as err:
            raise self.explain(err) from None
        if served and self.backend.model not in served:
            raise RemoteError(f"{self.backend.base_url} serves {', '.join(map(repr, served))}, not "
                              f"{self.backend.model!r}; set backend.model to one of them")

    async def stream_turn(self, messages: list[dict], tools: list[dict], params: SamplingParams,
                          reply: AssistantReply, on_pieces: Callable[[int], None]) -> AssistantReply:
        try:
            stream = await self.openai.chat.completions.create(
                model=self.backend.model, messages=messages, stream=True, stream_options={"include_usage": True},
                **({"tools": tools} if tools else {}), **request_options(params))
            async with stream:
                async for chunk in stream:
                    self._take(chunk, reply, on_pieces)
        except openai.APIError as err:
            raise self.explain(err) from None
        return reply

    async def close(self) -> None:
        await self.openai.close()

    def explain(self, err: openai.APIError) -> RemoteError:
        url = self.backend.base_url
        if isinstance(err, openai.APIConnectionError):
            return RemoteError(f"cannot reach {url} ({_root_cause(err)}): start the server "
                               "(swarm serve, vllm serve, sglang) or fix backend.base_url")
        if isinstance(err, (openai.AuthenticationError, openai.PermissionDeniedError)):
            where = (f"set ${self.backend.api_key_env} to the server's key" if self.backend.api_key_env
                     else "set backend.api_key_env to the variable that holds the server's key")
            return RemoteError(f"{url} refused the API key ({err.status_code}): {where}")
        message = _server_message(err)
        if isinstance(err, openai.NotFoundError):
            return RemoteError(f"{url} has no model {self.backend.model!r} or no such endpoint (404: {message}); "
                               "check backend.model and that base_url ends in /v1")
        if isinstance(err, openai.BadRequestError) and (err.code == "context_length_exceeded"
                                                        or _CONTEXT_FULL.search(message)):
            return ContextFullError(f"{url}: the conversation no longer fits the model's context ({message})")
        status = f"{err.status_code}: " if isinstance(err, openai.APIStatusError) else ""
        return RemoteError(f"{url} failed the request ({status}{message})")

    @staticmethod
    def _take(chunk, reply: AssistantReply, on_pieces: Callable[[int], None]) -> None:
        if chunk.usage is not None:
            reply.add_usage(chunk.usage)
        for choice in chunk.choices:
            pieces = reply.add_delta(choice.delta)
            if choice.finish_reason:
                reply.finish_reason = choice.finish_reason
            if pieces:
                on_pieces(pieces)


def _server_message(err: openai.APIError) -> str:
    """The server's own words: OpenAI's and swarm's {"error": {"message"}}, vLLM's {"message"}."""
    body = err.body.get("error", err.body) if isinstance(err.body, dict) else None
    message = body.get("message") if isinstance(body, dict) else None
    return _one_line(message if isinstance(message, str) and message else err.message)


def _root_cause(err: BaseException) -> str:
    """What the connection really failed on: 'connection refused', 'timed out', a DNS error..."""
    while (err.__cause__ or err.__context__) is not None:
        err = err.__cause__ or err.__context__
    if isinstance(err, OSError) and err.errno:
        return (os.strerror(err.errno) if err.errno > 0 else err.strerror or str(err)).lower()
    return _one_line(err) or type(err).__name__


def _one_line(text) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_ERROR_CHARS else line[:MAX_ERROR_CHARS - 3] + "..."
