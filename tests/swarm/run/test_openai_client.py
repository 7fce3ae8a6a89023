"""One streamed turn and the server's refusals, on the bytes a vLLM server sends."""
import asyncio
import importlib
import json

import openai
import pytest

from engine.sampling import SamplingParams
from swarm.run.openai_client import AssistantReply, ChatClient, ContextFullError, RemoteError, request_options
from swarm.spec.backend import BackendSpec

# The HTTP library the installed openai client is built on (httpx, or httpx2 in recent versions).
http = importlib.import_module(openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])

URL = "http://gpu:8000/v1"


def sse(*chunks: dict) -> bytes:
    return "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks).encode() + b"data: [DONE]\n\n"


def chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices, "usage": usage}


# vLLM with --tool-call-parser hermes: the call's name first, its arguments in pieces, then the usage.
VLLM_TOOL_STREAM = sse(
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Let me look."}),
    chunk({"tool_calls": [{"index": 0, "id": "chatcmpl-tool-9", "type": "function",
                           "function": {"name": "read_file", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": '}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"a.py"}'}}]}, finish="tool_calls"),
    chunk(None, usage={"prompt_tokens": 1500, "completion_tokens": 21, "total_tokens": 1521,
                       "prompt_tokens_details": {"cached_tokens": 1344}}))


def client_for(handler, **backend) -> ChatClient:
    client = ChatClient(BackendSpec("openai", URL, "m", **backend), max_retries=0)
    client.openai = openai.AsyncOpenAI(base_url=URL, api_key="k", max_retries=0,
                                       http_client=http.AsyncClient(transport=http.MockTransport(handler)))
    return client


def turn(handler, **backend) -> tuple[AssistantReply, list[int], dict]:
    sent, pieces = {}, []

    def recording(request):
        sent.update(json.loads(request.content))
        return handler(request)

    async def go():
        client = client_for(recording, **backend)
        try:
            return await client.stream_turn([{"role": "user", "content": "hi"}], [{"type": "function"}],
                                            SamplingParams(max_tokens=64, top_k=20, seed=3), AssistantReply(),
                                            pieces.append)
        finally:
            await client.close()
    return asyncio.run(go()), pieces, sent


def test_a_streamed_turn_gathers_text_calls_and_usage():
    reply, pieces, sent = turn(lambda request: http.Response(200, content=VLLM_TOOL_STREAM,
                                                             headers={"content-type": "text/event-stream"}))
    assert reply.content == "Let me look." and reply.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [("chatcmpl-tool-9", "read_file",
                                                                        '{"path": "a.py"}')]
    assert (reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens, reply.tokens) == (1500, 21, 1344, 21)
    assert sum(pieces) == reply.pieces == 4
    assert sent["stream"] and sent["stream_options"] == {"include_usage": True}
    assert (sent["max_tokens"], sent["top_k"], sent["seed"]) == (64, 20, 3) and "stop" not in sent
    assert reply.message()["tool_calls"][0]["function"]["arguments"] == '{"path": "a.py"}'


def test_top_k_goes_only_when_set():
    assert "extra_body" not in request_options(SamplingParams(top_k=0))


def refusal(status: int, body: dict):
    return lambda request: http.Response(status, json=body)


@pytest.mark.parametrize("status, body, backend, error, words", [
    (401, {"error": {"message": "Unauthorized"}}, {}, RemoteError,
     f"{URL} refused the API key (401): set backend.api_key_env to the variable that holds the server's key"),
    (401, {"error": {"message": "Unauthorized"}}, {"api_key_env": "VLLM_KEY"}, RemoteError,
     "(401): set $VLLM_KEY to the server's key"),
    (404, {"object": "error", "message": "The model `m` does not exist.", "type": "NotFoundError", "code": 404},
     {}, RemoteError, "has no model 'm' or no such endpoint (404: The model `m` does not exist.); check backend.model"),
    (400, {"object": "error", "message": "This model's maximum context length is 2048 tokens. However, you "
           "requested 2100 tokens (2036 in the messages, 64 in the completion).", "code": 400}, {}, ContextFullError,
     "no longer fits the model's context (This model's maximum context length is 2048 tokens."),
    (500, {"error": {"message": "CUDA out of memory"}}, {}, RemoteError,
     f"{URL} failed the request (500: CUDA out of memory)"),
])
def test_refusals_say_what_to_fix(monkeypatch, status, body, backend, error, words):
    monkeypatch.setenv("VLLM_KEY", "k")
    with pytest.raises(error) as caught:
        turn(refusal(status, body), **backend)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_the_model_check_names_what_the_server_serves():
    models = {"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model", "created": 1, "owned_by": "vllm",
                                          "max_model_len": 32768}]}

    async def check():
        client = client_for(lambda request: http.Response(200, json=models))
        try:
            await client.check_model()
        finally:
            await client.close()
    with pytest.raises(RemoteError, match=f"^{URL} serves 'Qwen/Qwen3-8B', not 'm'; set backend.model"):
        asyncio.run(check())
