"""OpenAI's Responses API on `swarm serve`: what Codex CLI speaks.

    POST /v1/responses    input items + tools -> a response with message and function_call items;
                          stream or not (swarm/server/responses_reply.py)

The conversation becomes the same chat messages and tools as a chat completion
(responses_protocol.py), rendered by the same ChatPrompter: the same conversation gives the same
prompt ids, so it shares KV blocks with agents on either API. A forced tool choice ends the prompt
with the start of a call, which the model then completes.
"""
from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from swarm.server.chat_output import OutputText
from swarm.server.generation import ServeContext, answer, check_model, start_job
from swarm.server.responses_protocol import ResponsesRequest
from swarm.server.responses_reply import ResponseReply


def add_responses_routes(app: FastAPI, ctx: ServeContext) -> None:
    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request):
        check_model(body, ctx.model)
        reply = await start_reply(ctx, body)
        events = reply.events(ctx.engine) if body.stream else None
        return await answer(ctx.engine, reply.job, body.stream, request, events, reply.response)


async def start_reply(ctx: ServeContext, body: ResponsesRequest) -> ResponseReply:
    conversation = body.conversation_inputs()
    inputs = conversation.inputs
    prompt = await run_in_threadpool(ctx.prompter.build, inputs.messages, inputs.tools, inputs.tool_choice)
    forced = ctx.tokenizer.encode(conversation.forced_prefix) if conversation.forced_prefix else []
    output = OutputText(ctx.tokenizer, body.stop_strings(), prompt.parse_tool_calls)
    output.add(forced)   # the reply starts with the forced start of a call: parsed with the rest
    job = await start_job(ctx, body, prompt.token_ids + forced, "input", output, chat=True)
    return ResponseReply(body, job, conversation.names, len(forced))
