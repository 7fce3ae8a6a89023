"""OpenAI's Responses API on `swarm serve`: what Codex CLI speaks.

    POST /v1/responses    input items + tools -> a response with message and function_call items;
                          stream or not (swarm/server/responses_reply.py)

The conversation becomes the same chat messages and tools as a chat completion
(responses_protocol.py), rendered by the same ChatPrompter: the same conversation gives the same
prompt ids, so it shares KV blocks with agents on either API. A forced tool choice ends the prompt
with the start of a call, which the model then completes (swarm/server/forced_call.py).
"""
from __future__ import annotations

from fastapi import FastAPI, Request

from swarm.server.generation import ServeContext, answer, check_model, start_chat_job
from swarm.server.responses_protocol import ResponsesRequest
from swarm.server.responses_reply import ResponseReply


def add_responses_routes(app: FastAPI, ctx: ServeContext) -> None:
    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request):
        check_model(body, ctx.model)
        reply = await start_reply(ctx, body)
        events = reply.events(ctx.engine) if body.stream else None
        return await answer(ctx, reply.job, body.stream, request, events, reply.response)


async def start_reply(ctx: ServeContext, body: ResponsesRequest) -> ResponseReply:
    conversation = body.conversation_inputs()
    job = await start_chat_job(ctx, body, conversation.inputs, "input")
    return ResponseReply(body, job, conversation.names)
