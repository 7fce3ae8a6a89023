"""Anthropic's Messages routes of `swarm serve` (what Claude Code and the `anthropic` SDK call).

    POST /v1/messages[?beta=true]     a reply of text and tool_use blocks; stream or not
    POST /v1/messages/count_tokens    {"input_tokens": the rendered prompt's length}
    GET  /v1/models/{model_id}        the served model's card

Streamed, a reply is these server-sent events (`event: <type>\\ndata: <json>\\n\\n`):

    message_start (usage so far), ping,
    content_block_start / content_block_delta (text_delta) ... / content_block_stop     the text, as it is safe
    content_block_start / content_block_delta (input_json_delta) / content_block_stop   one per tool call
    message_delta (stop_reason, stop_sequence, usage), message_stop                     or an `error` event

Usage as Anthropic counts it: input_tokens are the prompt tokens not read from the prefix cache.
"""
from __future__ import annotations

import json
import logging
import uuid
from contextlib import aclosing
from datetime import datetime, timezone
from typing import AsyncIterator

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from engine import AsyncEngine
from swarm.server.anthropic_protocol import MessagesInput, MessagesRequest, anthropic_error_body
from swarm.server.generation import ServeContext, answer, check_model, start_chat_job
from swarm.server.protocol import ApiError
from swarm.server.responses import ClientReply, Finished, Job, engine_deltas, note_finish, stream_with_errors

log = logging.getLogger("swarm.serve")
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def add_anthropic_routes(app: FastAPI, ctx: ServeContext) -> None:
    @app.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request):
        check_model(body, ctx.model, CLIENT_HINT)
        job = await _start(ctx, body)
        events = message_events(ctx.engine, job) if body.stream else None
        return await answer(ctx, job, body.stream, request, events, lambda: message_response(job))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: MessagesInput):
        check_model(body, ctx.model, CLIENT_HINT)
        inputs = body.chat_inputs()
        prompt = await run_in_threadpool(ctx.prompter.build, inputs.messages, inputs.tools, inputs.tool_choice)
        return {"input_tokens": len(prompt.token_ids)}

    @app.get("/v1/models/{model_id:path}")
    async def model_card(model_id: str):
        if model_id not in ctx.model.aliases | {ctx.model.name}:
            raise ApiError(404, f"the model {model_id!r} does not exist; this server serves {ctx.model.name!r}",
                           code="model_not_found")
        created = datetime.fromtimestamp(ctx.model.created, timezone.utc).isoformat().replace("+00:00", "Z")
        return {"id": ctx.model.name, "object": "model", "created": ctx.model.created, "owned_by": "swarm",
                "type": "model", "display_name": ctx.model.name, "created_at": created,
                "max_model_len": ctx.limits.context}


CLIENT_HINT = ("; Claude Code asks for the model named by ANTHROPIC_MODEL (and ANTHROPIC_DEFAULT_HAIKU_MODEL for "
               "its small tasks): set them to the served name")


async def _start(ctx: ServeContext, body: MessagesRequest) -> Job:
    job = await start_chat_job(ctx, body, body.chat_inputs(), "messages")
    job.request_id = f"msg_{uuid.uuid4().hex[:24]}"
    job.client_reply = lambda finished: ClientReply(stop_reason(job, finished)[0], finished.output.content or "",
                                                    [_tool_use(call) for call in finished.output.tool_calls])
    return job


def message_response(job: Job) -> dict:
    reason, sequence = stop_reason(job, job.finished)
    return {**_message(job, job.finished.num_cached_tokens), "content": _content_blocks(job.finished),
            "stop_reason": reason, "stop_sequence": sequence}


def stop_reason(job: Job, finished: Finished) -> tuple[str, str | None]:
    """Anthropic's reason and the stop sequence that ended the reply, if one did."""
    reason = STOP_REASONS.get(finished.finish_reason, finished.finish_reason)
    if reason != "end_turn" or not job.output.stop:
        return reason, None
    text = job.output.tokenizer.decode(job.output.token_ids)
    found = [(text.index(s), s) for s in job.output.stop if s in text]
    return ("stop_sequence", min(found)[1]) if found else (reason, None)


def _content_blocks(finished: Finished) -> list[dict]:
    text = finished.output.content
    blocks = [{"type": "text", "text": text}] if text else []
    return blocks + [_tool_use(call) for call in finished.output.tool_calls]


def _tool_use(call: dict) -> dict:
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"),
            "name": call["function"]["name"], "input": json.loads(call["function"]["arguments"])}


def _message(job: Job, num_cached_tokens: int) -> dict:
    return {"id": job.request_id, "type": "message", "role": "assistant", "model": job.model,
            "usage": _usage(job, num_cached_tokens)}


def _usage(job: Job, num_cached_tokens: int) -> dict:
    return {"input_tokens": len(job.prompt_ids) - num_cached_tokens, "output_tokens": job.generated_tokens(),
            "cache_read_input_tokens": num_cached_tokens, "cache_creation_input_tokens": 0}


async def message_events(engine: AsyncEngine, job: Job) -> AsyncIterator[str]:
    """The reply as server-sent events; a failure after the headers went out is an `error` event."""
    async with aclosing(stream_with_errors(_events(engine, job), job, _error_events)) as events:
        async for event in events:
            yield event


def _error_events(status: int, message: str) -> list[str]:
    return [_sse("error", anthropic_error_body(status, message))]


async def _events(engine: AsyncEngine, job: Job) -> AsyncIterator[str]:
    """The cached-token count comes with the first step, so message_start waits for it."""
    started, text_open = False, False
    async with aclosing(engine_deltas(engine, job)) as deltas:
        async for delta in deltas:
            if not started:
                yield _sse("message_start", {"type": "message_start", "message": {
                    **_message(job, delta.num_cached_tokens), "content": [], "stop_reason": None,
                    "stop_sequence": None}})
                yield _sse("ping", {"type": "ping"})
                started = True
            piece = job.output.add(delta.token_ids)
            if piece and not text_open:
                yield _block_start(0, {"type": "text", "text": ""})
                text_open = True
            if piece:
                yield _block_delta(0, {"type": "text_delta", "text": piece})
            note_finish(job, delta)
    for event in _closing_events(job, text_open):
        yield event


def _closing_events(job: Job, text_open: bool) -> list[str]:
    finished = job.finished
    rest = job.output.unsent(finished.output)
    events = [_block_start(0, {"type": "text", "text": ""})] if rest and not text_open else []
    events += [_block_delta(0, {"type": "text_delta", "text": rest})] if rest else []
    text_open = text_open or bool(rest)
    events += [_block_stop(0)] if text_open else []
    for index, call in enumerate(finished.output.tool_calls, start=int(text_open)):
        events += _tool_use_events(index, _tool_use(call))
    reason, sequence = stop_reason(job, finished)
    delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
             "usage": _usage(job, finished.num_cached_tokens)}
    return events + [_sse("message_delta", delta), _sse("message_stop", {"type": "message_stop"})]


def _tool_use_events(index: int, block: dict) -> list[str]:
    arguments = json.dumps(block["input"], ensure_ascii=False)
    return [_block_start(index, {**block, "input": {}}),
            _block_delta(index, {"type": "input_json_delta", "partial_json": arguments}), _block_stop(index)]


def _block_start(index: int, block: dict) -> str:
    return _sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def _block_delta(index: int, delta: dict) -> str:
    return _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _block_stop(index: int) -> str:
    return _sse("content_block_stop", {"type": "content_block_stop", "index": index})


def _sse(event: str, payload: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"
