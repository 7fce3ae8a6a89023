"""The HTTP app of `swarm serve`: every API's routes on one shared engine (swarm/server/generation.py).

    GET  /health                 200 while the engine loop runs
    GET  /v1/models              the one model served
    POST /v1/chat/completions    OpenAI chat, and /v1/completions (swarm/server/openai_routes.py)
    POST /v1/responses           OpenAI Responses, what Codex speaks (swarm/server/responses_routes.py)
    GET  /metrics                Prometheus: KV memory, sharing, prefix hits, requests, tokens

Every error is a 4xx/5xx with OpenAI's body, `{"error": {"message", "type", "param", "code"}}`.

A request is checked before the engine computes anything for it: body size, then (in a worker
thread, as rendering and tokenizing a long prompt takes seconds) its prompt, then whether the
prompt fits the context and the KV blocks the pinned trunk leaves it.

With `agent_keys` (key -> agent name, what `swarm run` gives its harnesses), each /v1/* request needs
one of those keys and is its agent's: in `request.state.agent`, on the generation job, in the
exchange records (swarm/server/exchanges.py) and in the swarm_agent_* metrics.
"""
from __future__ import annotations

import hmac
from pathlib import Path
from typing import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from engine import AsyncEngine
from swarm.server.anthropic_protocol import anthropic_error_body, is_anthropic_request
from swarm.server.anthropic_routes import add_anthropic_routes
from swarm.server.canonicalize import Canonicalizer
from swarm.server.capture import RequestCapture
from swarm.server.chat_prompt import ChatPrompter
from swarm.server.exchanges import ExchangeListener, Exchanges
from swarm.server.generation import Limits, ServeContext
from swarm.server.metrics import AgentCounts, CanonicalizedCounts, ReplyCounts, metrics_registry
from swarm.server.openai_routes import add_openai_routes
from swarm.server.protocol import ApiError, error_body, validation_message
from swarm.server.responses_routes import add_responses_routes
from swarm.server.served_model import ServedModel

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""Bodies above this get a 413: far more text than any context holds, little enough to parse."""


def build_app(engine: AsyncEngine, model: ServedModel, api_key: str | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, capture_dir: Path | None = None,
              canonicalize: bool = False, agent_keys: dict[str, str] | None = None,
              exchanges: Sequence[ExchangeListener] = (), max_output_tokens: int | None = None) -> FastAPI:
    """`exchanges`: told of every exchange (swarm/server/exchanges.py). `max_output_tokens`: no reply gets
    more, whatever a request asks (it ends with the length reason)."""
    app = FastAPI(title="swarm", docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app)
    if capture_dir is not None:  # inside the body limit: it sees only bodies the server takes
        app.add_middleware(RequestCapture, folder=capture_dir)
    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes)  # inside the key check: its errors reach ours
    keys = {api_key: None} if api_key else {}
    if keys or agent_keys:
        _require_key(app, {**keys, **(agent_keys or {})})
    tokenizer = engine.engine.tokenizer
    canonicalized = CanonicalizedCounts() if canonicalize else None
    prompter = ChatPrompter(tokenizer, Canonicalizer(canonicalized) if canonicalized is not None else None)
    per_agent = AgentCounts(sorted(set(agent_keys.values()))) if agent_keys else None
    listeners = [*([per_agent] if per_agent else []), *exchanges]
    ctx = ServeContext(engine, model, Limits.of(engine, max_output_tokens), tokenizer, prompter, ReplyCounts(),
                       Exchanges(listeners) if listeners else None)
    registry = metrics_registry(engine, model, ctx.replies, canonicalized, per_agent)
    add_openai_routes(app, ctx)
    add_responses_routes(app, ctx)
    add_anthropic_routes(app, ctx)

    @app.get("/health")
    async def health():
        if not engine.is_alive:
            raise ApiError(503, "the engine loop has stopped", type="server_error")
        return {"status": "ok", "model": model.name, "trunk_tokens": model.trunk_tokens}

    @app.get("/v1/models")
    async def models():
        card = {"id": model.name, "object": "model", "created": model.created, "owned_by": "swarm",
                "max_model_len": ctx.limits.context}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


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
            body = error_body(self._message(), "invalid_request_error")
            return await _error(Request(scope), 413, body)(scope, receive, send)
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


def _require_key(app: FastAPI, keys: dict[str, str | None]) -> None:
    """/v1/* asks for one of `keys` as `Authorization: Bearer <key>`, as OpenAI and vLLM do, or
    `x-api-key: <key>` from an Anthropic client, and is then the key's agent's (None: nobody's);
    /health and /metrics stay open."""
    assert all(keys), "an empty key would let in requests that send none"

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if not request.url.path.startswith("/v1"):
            return await call_next(request)
        anthropic = is_anthropic_request(request.url.path, request.headers)
        holders = [agent for key, agent in keys.items() if _carries(request.headers, key, anthropic)]
        if not holders:
            body = error_body("missing or wrong API key: send the key swarm serve was started with (under swarm "
                              "run, the agent's own) as `Authorization: Bearer <key>`"
                              + (" or `x-api-key: <key>`" if anthropic else ""),
                              "invalid_request_error", code="invalid_api_key")
            return _error(request, 401, body)
        request.state.agent = holders[0]
        return await call_next(request)


def _carries(headers: Headers, key: str, anthropic: bool) -> bool:
    """Compared in constant time, so the time taken tells nothing of how nearly a key matched."""
    bearer = hmac.compare_digest(headers.get("authorization", "").encode(), f"Bearer {key}".encode())
    return bearer or (anthropic and hmac.compare_digest(headers.get("x-api-key", "").encode(), key.encode()))


def _error(request: Request, status: int, body: dict, headers=None) -> JSONResponse:
    """OpenAI's error body, or Anthropic's for a request an Anthropic client sent."""
    if is_anthropic_request(request.url.path, request.headers):
        body = anthropic_error_body(status, body["error"]["message"])
    return JSONResponse(body, status_code=status, headers=headers)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError):
        return _error(request, err.status, err.body())

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError):
        message, param = validation_message(err.errors())
        return _error(request, 400, error_body(message, "invalid_request_error", param))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):
        message = err.detail if err.status_code != 404 else (
            f"no route {request.method} {request.url.path}; "
            "this server has /v1/models, /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, "
            "/health and /metrics")
        kind = "invalid_request_error" if err.status_code < 500 else "server_error"
        return _error(request, err.status_code, error_body(str(message), kind), err.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception):  # uvicorn logs the traceback
        return _error(request, 500, error_body(f"internal error: {type(err).__name__}: {err}", "server_error"))
