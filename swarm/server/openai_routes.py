"""OpenAI's chat and completions routes of `swarm serve`.

    POST /v1/chat/completions    messages + tools -> a reply or tool calls; stream or not
    POST /v1/completions         a prompt (text or token ids) -> text; stream or not
"""
from __future__ import annotations

from fastapi import FastAPI, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from engine import Tokenizer
from swarm.server.chat_output import OutputText
from swarm.server.generation import ChatInputs, Limits, ServeContext, answer, check_model, start_chat_job, start_job
from swarm.server.protocol import ChatCompletionRequest, CompletionRequest, body_error, utf8_text


def add_openai_routes(app: FastAPI, ctx: ServeContext) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        check_model(body, ctx.model)
        job = await start_chat_job(ctx, body, ChatInputs(body.messages, body.tools, body.tool_choice), "messages")
        return await answer(ctx, job, body.stream, request)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        check_model(body, ctx.model)
        ids = await run_in_threadpool(completion_ids, body.single_prompt(), ctx.tokenizer, ctx.limits)
        output = OutputText(ctx.tokenizer, body.stop_strings(), tool_calls=False)
        job = await start_job(ctx, body, ids, "prompt", output, chat=False)
        return await answer(ctx, job, body.stream, request)


def chat_inputs_from_body(body: dict) -> ChatInputs:
    """A raw /v1/chat/completions body as the chat inputs the route renders (for inspect-prefix --requests)."""
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as err:
        raise body_error(err, "chat completions") from None
    return ChatInputs(request.messages, request.tools, request.tool_choice)


def completion_ids(prompt: str | list, tokenizer: Tokenizer, limits: Limits) -> list[int]:
    if isinstance(prompt, str):
        return tokenizer.encode(utf8_text(prompt, "prompt"), add_special_tokens=True)
    return limits.check_token_ids(prompt)
