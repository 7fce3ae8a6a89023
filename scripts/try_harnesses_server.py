"""The `swarm serve` that scripts/try_harnesses.py runs: the real CLI, with two things swapped in before it
starts: a sampler that "generates" scripted replies (the model is random) and an ASGI wrapper that records
every request and its reply.

    script.json (rewritten by the driver before each agent):  {"call": {...} | null, "final": "...", "title": "..."}
    prompt offers no tools        -> title   (OpenCode's title request, or any side request)
    prompt has no tool result yet -> call    as `<tool_call>{json}</tool_call>`, so serve parses it
    prompt carries a tool result  -> final   (a text, or one more call: mini-swe-agent's submit command)
"""
from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers.serving import ReplySampler  # noqa: E402

TOOL_RESULT_TAG = "<tool_response>"
TOOLS_TAG = "<tools>"


def serve_scripted(records: Path, serve_args: list[str]) -> None:
    import engine.llm_engine as llm_engine
    import swarm.server.app as app_module
    from swarm.cli.main import main

    start_engine = llm_engine.LLMEngine.__init__

    def engine_with_script(self, *args, **options):
        start_engine(self, *args, **options)
        self.sampler = ScriptedSampler(self, records / "script.json")

    build_app = app_module.build_app
    llm_engine.LLMEngine.__init__ = engine_with_script
    app_module.build_app = lambda *args, **options: Recorder(build_app(*args, **options), records)
    sys.argv = ["swarm", "serve", *serve_args]
    main()


class ScriptedSampler(ReplySampler):
    """The tests' reply sampler, with each new sequence's reply chosen by its prompt."""

    def __init__(self, engine, script_file: Path):
        super().__init__(engine, [""])
        self.script_file = script_file

    def _next(self, seq_id: int) -> int:
        if seq_id not in self.pending:
            seq = self.engine.live[seq_id]
            prompt = self.engine.tokenizer.decode(seq.token_ids[:seq.num_prompt_tokens], skip_special_tokens=False)
            reply = reply_for(prompt, json.loads(self.script_file.read_text()))
            self.pending[seq_id] = self.engine.tokenizer.encode(reply) + self.engine.tokenizer.eos_token_ids[:1]
        return super()._next(seq_id)


def reply_for(prompt: str, script: dict) -> str:
    if script.get("call") is None:
        return as_text(script["final"])
    if TOOLS_TAG not in prompt:
        return script.get("title", "Add subtract")
    conversation = prompt.split("<|im_end|>", 1)[-1]   # past the system turn, where the tools are
    return as_text(script["final"] if TOOL_RESULT_TAG in conversation else script["call"])


def as_text(reply: str | dict) -> str:
    if isinstance(reply, str):
        return reply
    return f"<tool_call>\n{json.dumps(reply)}\n</tool_call>"


class Recorder:
    """ASGI wrapper: writes NNNN.json = {method, path, status, content_type, body, reply} per request."""

    def __init__(self, app, folder: Path):
        self.app = app
        self.folder = folder
        self.count = itertools.count(1)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        received, sent, response = [], [], {}

        async def recording_receive():
            message = await receive()
            received.append(message.get("body", b""))
            return message

        async def recording_send(message):
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
                response["content_type"] = dict(message.get("headers", [])).get(b"content-type", b"").decode()
            elif message["type"] == "http.response.body":
                sent.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, recording_receive, recording_send)
        finally:
            self._write(scope, b"".join(received), b"".join(sent), response)

    def _write(self, scope, body: bytes, reply: bytes, response: dict) -> None:
        query = scope.get("query_string", b"").decode()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode(errors="replace")
        record = {"method": scope["method"], "path": scope["path"] + (f"?{query}" if query else ""),
                  "status": response.get("status", 0), "content_type": response.get("content_type", ""),
                  "body": parsed, "reply": reply.decode(errors="replace")}
        path = self.folder / f"{next(self.count):04d}.json"
        path.write_text(json.dumps(record, indent=1, ensure_ascii=False))
