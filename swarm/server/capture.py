"""`swarm serve --capture DIR`: every POST body under /v1 the server receives, one file each, as received.

    DIR/000001-messages.json          the body, pretty-printed JSON (a body that is not JSON: .body, its bytes)
    DIR/000001-messages.meta.json     method, path, query, headers (no keys or tokens), time, body file
    DIR/000002-chat-completions.json  ...

Numbers go on from the highest already in DIR, so the files sort in arrival order, across restarts
too. The body is captured before any route reads it, so requests to routes the server lacks and
requests it refuses are there as well: what a harness sends, whatever swarm makes of it. A body the
size limit refuses, or one the client gave up on before its end, is not written. A write that fails
is a log line; the request goes on as if nothing were captured.
"""
from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timezone
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("swarm.serve")

CAPTURED_PREFIX = "/v1/"
SECRET_HEADER_WORDS = ("auth", "key", "token", "secret", "cookie", "password")
"""A header whose name holds one of these is left out (its name is kept in `dropped_headers`)."""
META_SUFFIX = ".meta.json"
_NUMBERED = re.compile(r"^(\d+)-")


class RequestCapture:
    """ASGI middleware: writes each POST /v1/* body to `folder`, then hands the request on unchanged."""

    def __init__(self, app: ASGIApp, folder: Path):
        self.app = app
        self.folder = Path(folder)
        self._next_number = _first_free_number(self.folder)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _captured(scope):
            return await self.app(scope, receive, send)
        messages, error = await _read_body(receive)
        if error is None and _complete(messages):
            number, self._next_number = self._next_number, self._next_number + 1
            body = b"".join(m.get("body", b"") for m in messages)
            await run_in_threadpool(self._write, number, scope, body)
        await self.app(scope, _replay(messages, error, receive), send)

    def _write(self, number: int, scope: Scope, body: bytes) -> None:
        stem = f"{number:06d}-{_route_name(scope['path'])}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            body_file = _write_body(self.folder / stem, body)
            meta = _meta(scope, body, body_file)
            (self.folder / f"{stem}{META_SUFFIX}").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        except OSError as err:
            log.warning("--capture: cannot write request %s to %s (%s); the request goes on uncaptured",
                        stem, self.folder, err)


def _captured(scope: Scope) -> bool:
    return scope["type"] == "http" and scope["method"] == "POST" and scope["path"].startswith(CAPTURED_PREFIX)


async def _read_body(receive: Receive) -> tuple[list[Message], Exception | None]:
    """The messages up to the body's end (or a disconnect), and the error a receive raised, if one did
    (the body limit's 413: raised again where the route reads the body, so its handler answers it)."""
    messages: list[Message] = []
    try:
        while not messages or (messages[-1]["type"] == "http.request" and messages[-1].get("more_body")):
            messages.append(await receive())
    except Exception as err:  # whatever it is, the route sees it where it would have
        return messages, err
    return messages, None


def _complete(messages: list[Message]) -> bool:
    return bool(messages) and messages[-1]["type"] == "http.request"


def _replay(messages: list[Message], error: Exception | None, receive: Receive) -> Receive:
    """A receive that gives the route what was read, then the error, then the client's own receive."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        if error is not None:
            raise error
        return await receive()
    return replayed


def _write_body(stem: Path, body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:  # not JSON (nor UTF-8): kept byte for byte
        path = stem.with_name(stem.name + ".body")
        path.write_bytes(body)
        return path.name
    path = stem.with_name(stem.name + ".json")
    path.write_bytes(_pretty(parsed))
    return path.name


def _pretty(parsed) -> bytes:
    try:
        return (json.dumps(parsed, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:  # an unpaired surrogate (valid JSON, not UTF-8): keep it as its \u escape
        return (json.dumps(parsed, indent=1) + "\n").encode("ascii")


def _meta(scope: Scope, body: bytes, body_file: str) -> dict:
    headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
    dropped = [name for name, _ in headers if any(word in name for word in SECRET_HEADER_WORDS)]
    return {"method": scope["method"], "path": scope["path"],
            "query": scope.get("query_string", b"").decode("latin-1"),
            "headers": {name: value for name, value in headers if name not in dropped},
            "dropped_headers": sorted(set(dropped)),
            "received_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "body_bytes": len(body), "body_file": body_file}


def _route_name(path: str) -> str:
    """/v1/chat/completions -> chat-completions; /v1/messages/count_tokens -> messages-count_tokens."""
    name = re.sub(r"[^A-Za-z0-9_.]+", "-", path.removeprefix(CAPTURED_PREFIX)).strip("-.")
    return name[:60] or "request"


def _first_free_number(folder: Path) -> int:
    try:
        numbers = [int(m.group(1)) for p in folder.iterdir() if (m := _NUMBERED.match(p.name))]
    except OSError:  # not there yet (or not readable: the writes will say so)
        return 1
    return max(numbers, default=0) + 1
