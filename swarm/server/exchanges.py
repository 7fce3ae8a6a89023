"""Each exchange of `swarm serve`, as a record for whoever listens (`swarm run` writes them to the agent's
JSONL transcript): one when a generation starts, one when it ends, however it ends.

    request in -> prompt rendered, fits -> ExchangeStarted     (agent, api, request id, body, prompt tokens)
               -> reply, whole or streamed,
                  or cancelled, or failed -> ExchangeFinished  (finish reason, tokens, text, tool calls, error)

Attribution: a request is its agent's by the key it came with (build_app's agent_keys). The engine
request id is the job's own id, as the client sees it (`chatcmpl-…`, `cmpl-…`, `msg_…`; a response's
`resp_…` id ends with it), so the engine is not changed: its per-request KV rows
(engine/kv/stats.py RequestKV.request_id) map to agents through ExchangeStarted.request_id.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Protocol

from swarm.server.responses import Job

log = logging.getLogger("swarm.serve")

API_BY_PATH = {"/v1/chat/completions": "chat.completions", "/v1/completions": "completions",
               "/v1/messages": "messages", "/v1/responses": "responses"}


@dataclass(slots=True)
class ExchangeStarted:
    agent: str | None
    api: str                 # chat.completions | completions | messages | responses
    request_id: str          # the engine's
    request: dict            # the body as received
    prompt_tokens: int
    time: float              # Unix seconds
    prompt_ids: list[int] = field(default_factory=list, repr=False)
    """The rendered prompt, for whoever watches what requests share (not in the transcript)."""

    def to_json(self) -> dict:
        return {"event": "started", **{name: getattr(self, name) for name in TRANSCRIPT_FIELDS}}


TRANSCRIPT_FIELDS = [item.name for item in fields(ExchangeStarted) if item.name != "prompt_ids"]
"""A started record's fields in its transcript line: all but the prompt's ids."""


@dataclass(slots=True)
class ExchangeFinished:
    agent: str | None
    api: str
    request_id: str
    finish_reason: str       # in the API's words (end_turn, tool_calls, incomplete...); cancelled or error
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    text: str                # what the client got: all of it, or what was streamed before it ended
    tool_calls: list[dict]   # in the API's shapes (tool_use blocks, function_call items, OpenAI calls)
    error: str | None
    time: float

    def to_json(self) -> dict:
        return {"event": "finished", **asdict(self)}


class ExchangeListener(Protocol):
    """Called on the server's event loop: return at once, hand slow work to a thread."""

    def started(self, record: ExchangeStarted) -> None: ...

    def finished(self, record: ExchangeFinished) -> None: ...


class Exchanges:
    """Tells every listener of each exchange; a listener that raises is logged and fails no request."""

    def __init__(self, listeners: list[ExchangeListener]):
        self.listeners = listeners

    def started(self, job: Job, path: str, body: dict) -> None:
        record = ExchangeStarted(job.agent, API_BY_PATH.get(path, path), job.request_id, body,
                                 len(job.prompt_ids), time.time(), list(job.prompt_ids))
        self._tell("started", record)

    def finished(self, job: Job, path: str) -> None:
        try:
            record = finished_record(job, API_BY_PATH.get(path, path))
        except Exception:
            log.exception("could not make the record of how %s finished", job.request_id)
            return
        self._tell("finished", record)

    def _tell(self, event: str, record: ExchangeStarted | ExchangeFinished) -> None:
        for listener in self.listeners:
            try:
                getattr(listener, event)(record)
            except Exception:
                log.exception("exchange listener %r failed on %s of %s", listener, event, record.request_id)


def finished_record(job: Job, api: str) -> ExchangeFinished:
    if job.finished is not None:
        reply = job.client_reply(job.finished)
        reason, text, calls = reply.finish_reason, reply.text, reply.tool_calls
    else:
        reason, text, calls = "error" if job.error else "cancelled", job.output.sent, []
    return ExchangeFinished(job.agent, api, job.request_id, reason, len(job.prompt_ids), job.num_cached_tokens,
                            job.generated_tokens(), text, calls, job.error, time.time())
