"""One generation answered in the Responses API's shapes: a response object, or its events.

    event: response.created                  {"type", "sequence_number", "response": {... "in_progress"}}
    event: response.in_progress
    event: response.output_item.added        the message, when its first text is safe to send
    event: response.content_part.added
    event: response.output_text.delta        (repeated)
    event: response.output_text.done / content_part.done / output_item.done
    event: response.output_item.added        each function call, once the reply is parsed
    event: response.function_call_arguments.delta / .done, response.output_item.done
    event: response.completed                or response.incomplete (max_output_tokens), response.failed

Streamed or not, a reply has the same output items and ids.
"""
from __future__ import annotations

import itertools
import json
import logging
import uuid
from contextlib import aclosing
from typing import AsyncIterator

from engine import AsyncEngine, RequestFailed
from swarm.server.responses import ClientReply, Finished, Job, text_pieces
from swarm.server.responses_protocol import ResponsesRequest
from swarm.server.responses_tools import ToolNames

log = logging.getLogger("swarm.serve")


class ResponseReply:
    def __init__(self, body: ResponsesRequest, job: Job, names: ToolNames):
        self.body, self.job, self.names = body, job, names
        self.id = "resp_" + job.request_id.split("-", 1)[-1]   # the engine's request id, for the logs
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self._sequence = itertools.count()
        self._items: list[dict] | None = None
        job.client_reply = self._client_reply

    def response(self, status: str = "completed", output: list[dict] | None = None, error: dict | None = None) -> dict:
        """The response object; after the generation, the whole one."""
        finished = self.job.finished
        if finished is not None and status == "completed":
            output, status = self.output_items(), self._status(finished)
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        body = self.body
        return {"id": self.id, "object": "response", "created_at": self.job.created, "status": status,
                "background": False, "error": error, "incomplete_details": incomplete,
                "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
                "model": body.model, "output": output or [], "parallel_tool_calls": body.parallel_tool_calls,
                "previous_response_id": None, "prompt_cache_key": body.prompt_cache_key,
                "reasoning": {"effort": None, "summary": None}, "service_tier": "default",
                "store": bool(body.store), "temperature": body.temperature, "text": {"format": {"type": "text"}},
                "tool_choice": body.tool_choice or "auto", "tools": body.tools or [], "top_p": body.top_p,
                "truncation": body.truncation or "disabled", "usage": self._usage(finished),
                "user": body.user, "metadata": body.metadata or {}}

    def output_items(self) -> list[dict]:
        if self._items is None:
            finished = self.job.finished
            status = "incomplete" if self._status(finished) == "incomplete" else "completed"
            content = finished.output.content
            items = [self._message(content, status)] if content else []
            calls = finished.output.tool_calls[:None if self.body.parallel_tool_calls else 1]
            self._items = items + [self._function_call(call) for call in calls]
        return self._items

    async def events(self, engine: AsyncEngine) -> AsyncIterator[str]:
        yield self._event("response.created", response=self.response("in_progress"))
        yield self._event("response.in_progress", response=self.response("in_progress"))
        opened = False
        try:
            async with aclosing(text_pieces(engine, self.job)) as pieces:
                async for piece in pieces:
                    if not opened:
                        opened = True
                        for event in self._open_message():
                            yield event
                    yield self._text_delta(piece)
        except Exception as err:
            yield self._failed(err)
            return
        for event in self._final_events(opened):
            yield event

    def _final_events(self, opened: bool) -> list[str]:
        events, items = [], self.output_items()
        for index, item in enumerate(items):
            if item["type"] == "message":
                if not opened:
                    events += self._open_message()
                rest = self.job.output.unsent(self.job.finished.output)
                events += [self._text_delta(rest)] if rest else []
                events += self._close_message(item)
            else:
                events += self._call_events(index, item)
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}[self._status(self.job.finished)]
        return events + [self._event(kind, response=self.response())]

    def _open_message(self) -> list[str]:
        item = {**self._message("", "in_progress"), "content": []}
        return [self._event("response.output_item.added", output_index=0, item=item),
                self._event("response.content_part.added", item_id=self.message_id, output_index=0,
                            content_index=0, part=_text_part(""))]

    def _text_delta(self, piece: str) -> str:
        return self._event("response.output_text.delta", item_id=self.message_id, output_index=0, content_index=0,
                           delta=piece, logprobs=[])

    def _close_message(self, item: dict) -> list[str]:
        part = item["content"][0]
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        return [self._event("response.output_text.done", **where, text=part["text"], logprobs=[]),
                self._event("response.content_part.done", **where, part=part),
                self._event("response.output_item.done", output_index=0, item=item)]

    def _call_events(self, index: int, item: dict) -> list[str]:
        added = {**item, "arguments": "", "status": "in_progress"}
        where = {"item_id": item["id"], "output_index": index}
        return [self._event("response.output_item.added", output_index=index, item=added),
                self._event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
                self._event("response.function_call_arguments.done", **where, name=item["name"],
                            arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=item)]

    def _failed(self, err: Exception) -> str:
        if isinstance(err, RequestFailed):
            error = {"code": "server_error" if err.internal else "invalid_request", "message": str(err)}
        else:
            log.exception("stream %s failed", self.job.request_id)
            error = {"code": "server_error", "message": f"internal error: {type(err).__name__}: {err}"}
        return self._event("response.failed", response=self.response("failed", error=error))

    def _message(self, text: str, status: str) -> dict:
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": [_text_part(text)]}

    def _function_call(self, call: dict) -> dict:
        namespace, name = self.names.wire(call["function"]["name"])
        item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"], "name": name,
                "arguments": call["function"]["arguments"], "status": "completed"}
        return {**item, "namespace": namespace} if namespace else item

    def _client_reply(self, finished: Finished) -> ClientReply:
        calls = [item for item in self.output_items() if item["type"] == "function_call"]
        return ClientReply(self._status(finished), finished.output.content or "", calls)

    def _status(self, finished: Finished) -> str:
        return "incomplete" if finished.finish_reason == "length" else "completed"

    def _usage(self, finished: Finished | None) -> dict | None:
        if finished is None:
            return None
        prompt, generated = len(self.job.prompt_ids), self.job.generated_tokens()
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": finished.num_cached_tokens},
                "output_tokens": generated, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + generated}

    def _event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": next(self._sequence), **fields}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
