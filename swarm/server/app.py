"""The HTTP routes of `swarm serve`: OpenAI's chat and completions API on one shared engine.

    GET  /health                 200 while the engine loop runs
    GET  /v1/models              the one model served
    POST /v1/chat/completions    messages + tools -> a reply or tool calls; stream or not
    POST /v1/completions         a prompt (text or token ids) -> text; stream or not
    GET  /metrics                Prometheus: KV memory, sharing, prefix hits, requests, tokens

Every error is a 4xx/5xx with OpenAI's body, `{"error": {"message", "type", "param", "code"}}`.

A request is checked before the engine computes anything for it: body size, then (in a worker
thread, as rendering and tokenizing a long prompt takes seconds) its prompt, then whether the
prompt fits the context and the KV blocks the pinned trunk leaves it.
"""
from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from engine import AsyncEngine, Tokenizer
from swarm.server.chat_output import OutputText
from swarm.server.chat_prompt import ChatPrompter
from swarm.server.metrics import ReplyCounts, metrics_registry
from swarm.server.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    error_body,
    utf8_text,
)
from swarm.server.responses import ClientGone, Job, generate_all, generate_events
from swarm.server.served_model import ServedModel

log = logging.getLogger("swarm.serve")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""Bodies above this get a 413: far more text than any context holds, little enough to parse."""


def build_app(engine: AsyncEngine, model: ServedModel, api_key: str | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="swarm", docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app)
    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes)  # inside the key check: its errors reach ours
    if api_key:
        _require_key(app, api_key)
    limits = _Limits.of(engine)
    tokenizer = engine.engine.tokenizer
    prompter = ChatPrompter(tokenizer)
    replies = ReplyCounts()
    registry = metrics_registry(engine, model, replies)

    @app.get("/health")
    async def health():
        if not engine.is_alive:
            raise ApiError(503, "the engine loop has stopped", type="server_error")
        return {"status": "ok", "model": model.name, "trunk_tokens": model.trunk_tokens}

    @app.get("/v1/models")
    async def models():
        card = {"id": model.name, "object": "model", "created": model.created, "owned_by": "swarm",
                "max_model_len": limits.context}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _check(body, model)
        prompt = await run_in_threadpool(prompter.build, body.messages, body.tools, body.tool_choice)
        output = OutputText(tokenizer, body.stop_strings(), prompt.parse_tool_calls)
        job = await _job(engine, body, limits, prompt.token_ids, "messages", output, replies, chat=True)
        return await _answer(engine, job, body.stream, request)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check(body, model)
        ids = await run_in_threadpool(_completion_ids, body.single_prompt(), tokenizer, limits)
        output = OutputText(tokenizer, body.stop_strings(), tool_calls=False)
        job = await _job(engine, body, limits, ids, "prompt", output, replies, chat=False)
        return await _answer(engine, job, body.stream, request)

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


@dataclass(slots=True)
class _Limits:
    context: int
    kv_tokens: int
    vocab_size: int

    @classmethod
    def of(cls, engine: AsyncEngine) -> "_Limits":
        llm = engine.engine
        return cls(llm.config.max_position_embeddings, llm.kv_capacity_tokens, llm.config.vocab_size)

    async def room(self, engine: AsyncEngine, prompt_ids: list[int], param: str) -> int:
        """How many tokens may follow the prompt; a 400 before any compute when it alone does not fit."""
        prompt = len(prompt_ids)
        if prompt >= self.context:
            raise ApiError(400, f"this model's maximum context length is {self.context} tokens, and the "
                                f"{param} have {prompt}; shorten them", param=param, code="context_length_exceeded")
        held = await engine.max_request_tokens(prompt_ids)
        if prompt >= held:
            raise ApiError(400, self._kv_full(prompt, held, param), param=param, code="context_length_exceeded")
        return min(self.context, held) - prompt

    def _kv_full(self, prompt: int, held: int, param: str) -> str:
        pinned = self.kv_tokens - held
        pool = (f"the pool holds {self.kv_tokens} tokens and the pinned trunk keeps {pinned} of them (a prompt "
                "that starts with the trunk shares those)") if pinned else f"the pool holds {self.kv_tokens} tokens"
        return (f"the {param} have {prompt} tokens, but at most {held - 1} fit in this server's KV cache: {pool}; "
                "shorten them or restart with a larger --kv-budget")

    def check_token_ids(self, ids: list) -> list[int]:
        bad = next((i for i, t in enumerate(ids) if type(t) is not int or not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ApiError(400, f"prompt: token ids must be integers from 0 to {self.vocab_size - 1}; item {bad} "
                                f"is {json.dumps(ids[bad])}", param="prompt")
        return ids


def _completion_ids(prompt: str | list, tokenizer: Tokenizer, limits: _Limits) -> list[int]:
    if isinstance(prompt, str):
        return tokenizer.encode(utf8_text(prompt, "prompt"), add_special_tokens=True)
    return limits.check_token_ids(prompt)


def _check(body: GenerationRequest, model: ServedModel) -> None:
    if body.model not in model.aliases | {model.name}:
        raise ApiError(404, f"the model {body.model!r} does not exist; this server serves {model.name!r}",
                       param="model", code="model_not_found")
    body.check_supported()


async def _job(engine: AsyncEngine, body: GenerationRequest, limits: _Limits, prompt_ids: list[int],
               param: str, output: OutputText, replies: ReplyCounts, chat: bool) -> Job:
    room = await limits.room(engine, prompt_ids, param)
    wanted = body.requested_max_tokens()
    try:  # more than fits, or none asked: up to what fits, ending with "length" (as llama.cpp does)
        params = body.sampling_params(min(wanted or room, room))
    except ValueError as err:
        raise ApiError(400, str(err)) from None
    prefix = "chatcmpl" if chat else "cmpl"
    return Job(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), body.model, prompt_ids, params, output,
               body.include_usage, chat, on_finish=replies.add)


class _EventStream(StreamingResponse):
    """Closes its events however the response ends, so a client that left cancels its request now."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def _answer(engine: AsyncEngine, job: Job, stream: bool, request: Request) -> Response:
    if stream:
        return _EventStream(generate_events(engine, job), media_type="text/event-stream",
                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        return JSONResponse(await generate_all(engine, job, request))
    except ClientGone:
        log.info("client of %s went away; request cancelled", job.request_id)
        return Response(status_code=499)


class _BodyLimit:
    """413 for a body over `max_bytes`, before anything parses it: at once when its Content-Length
    says so, else when the bytes received pass the limit. (uvicorn reads and drops the rest.)"""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if _content_length(scope) > self.max_bytes:
            return await JSONResponse(error_body(self._message(), "invalid_request_error"), 413)(scope, receive, send)
        received = 0

        async def receive_within_limit():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:  # raised inside the route's body read: the error handlers answer it
                raise HTTPException(413, self._message())
            return message

        await self.app(scope, receive_within_limit, send)

    def _message(self) -> str:
        return (f"the request body is larger than the {_binary_size(self.max_bytes)} ({self.max_bytes} bytes) "
                "this server takes; send a shorter prompt")


def _binary_size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB"


def _content_length(scope: Scope) -> int:
    value = Headers(scope=scope).get("content-length", "")
    return int(value) if value.isdigit() else -1


def _require_key(app: FastAPI, api_key: str) -> None:
    """/v1/* asks for `Authorization: Bearer <key>`, as OpenAI and vLLM do; /health and /metrics stay open."""
    expected = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        given = request.headers.get("authorization", "").encode()
        if request.url.path.startswith("/v1") and not hmac.compare_digest(given, expected):
            body = error_body("missing or wrong API key: send the key swarm serve was started with as "
                              "`Authorization: Bearer <key>`", "invalid_request_error", code="invalid_api_key")
            return JSONResponse(body, status_code=401)
        return await call_next(request)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError):
        message, param = _validation_message(err)
        return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):
        message = err.detail if err.status_code != 404 else (
            f"no route {request.method} {request.url.path}; "
            "this server has /v1/models, /v1/chat/completions, /v1/completions, /health and /metrics")
        kind = "invalid_request_error" if err.status_code < 500 else "server_error"
        return JSONResponse(error_body(str(message), kind), status_code=err.status_code, headers=err.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception):  # uvicorn logs the traceback
        return JSONResponse(error_body(f"internal error: {type(err).__name__}: {err}", "server_error"),
                            status_code=500)


def _validation_message(err: RequestValidationError) -> tuple[str, str | None]:
    first = err.errors()[0] if err.errors() else {"msg": "invalid request", "loc": ()}
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
