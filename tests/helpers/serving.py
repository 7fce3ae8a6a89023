"""Shared by the `swarm serve` tests: a real server on a free port, in this process or as the CLI,
and a sampler that makes the real engine "generate" scripted replies."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai

from engine.async_engine import AsyncEngine
from engine.llm_engine import EngineOptions, LLMEngine
from swarm.server.app import build_app
from swarm.server.loopback import BackgroundServer, bind
from swarm.server.served_model import ServedModel
from tests.helpers.runs import EOS_ID

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny"


class ServerThread:
    """uvicorn serving `build_app` in a thread, on a port the OS picks."""

    def __init__(self, engine: LLMEngine, model: ServedModel | None = None, api_key: str | None = None,
                 **app_options):
        self.async_engine = AsyncEngine(engine).start()
        self.served = model or ServedModel(MODEL)
        app = build_app(self.async_engine, self.served, api_key, **app_options)
        self.background = BackgroundServer(app, bind("127.0.0.1", 0))
        self.port = self.background.port

    @property
    def thread(self):
        """The thread uvicorn serves on."""
        return self.background.thread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, api_key: str = "unused", **options) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **options)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(self.url + "/metrics").text)

    def __enter__(self) -> "ServerThread":
        self.background.start()
        return self

    def __exit__(self, *exc) -> None:
        self.background.stop()
        self.async_engine.shutdown()


def start_engine(model_dir: Path, **options) -> LLMEngine:
    return LLMEngine(str(model_dir), EngineOptions(device="cpu", dtype="float32", **options))


def parse_metrics(text: str) -> dict[str, float]:
    """`name{labels}` -> value, for the samples of a Prometheus text exposition."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return samples


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


class ReplySampler:
    """Stands in for the engine's sampler: request n "generates" replies[n] (the last one once
    they run out), token by token, then EOS."""

    def __init__(self, engine: LLMEngine, replies: list[str]):
        self.engine = engine
        self.replies = list(replies)
        self.pending: dict[int, list[int]] = {}

    def sample(self, logits, rows) -> list[int]:
        return [self._next(seq_id) for seq_id, _ in rows]

    def forget(self, seq_id: int) -> None:
        self.pending.pop(seq_id, None)

    def _next(self, seq_id: int) -> int:
        if seq_id not in self.pending:
            text = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
            self.pending[seq_id] = self.engine.tokenizer.encode(text) + [EOS_ID]
        tokens = self.pending[seq_id]
        return tokens.pop(0) if tokens else EOS_ID


def script(server: ServerThread, *replies: str) -> None:
    """From now on the server's engine "generates" `replies`, one a request (the last one once they run out)."""
    server.async_engine.call(lambda engine: setattr(engine, "sampler", ReplySampler(engine, list(replies)))).result()


@contextmanager
def real_sampler(server: ServerThread):
    """The engine's own sampler again on leaving, whatever was scripted inside."""
    engine = server.async_engine.engine
    real = engine.sampler
    try:
        yield
    finally:
        server.async_engine.call(lambda e: setattr(e, "sampler", real)).result()
    assert engine.sampler is real


@contextmanager
def scripted(server: ServerThread, *replies: str):
    """The engine "generates" `replies`, one a request, while inside."""
    with real_sampler(server):
        script(server, *replies)
        yield


@contextmanager
def failing_steps(server: ServerThread, count: int, message: str = "injected fault"):
    """The engine's next `count` model steps raise RuntimeError(message) while inside; the real ones after."""
    runner = server.async_engine.engine.runner
    real_run = runner.run
    faults = iter([RuntimeError(message)] * count)

    def run(batch):
        fault = next(faults, None)
        if fault is not None:
            raise fault
        return real_run(batch)

    runner.run = run
    try:
        yield
    finally:
        runner.run = real_run


@contextmanager
def serve_cli(*args: str, timeout: float = 60, env: dict | None = None):
    """`swarm serve ARGS --port 0 --json` as a subprocess; yields (ready info, process)."""
    command = [sys.executable, "-m", "swarm", "serve", *args, "--port", "0", "--json", "--log-level", "warning"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {})})
    try:
        line = _read_line(process, timeout)
        assert line, f"swarm serve printed no ready line; stderr: {process.stderr.read()}"
        yield json.loads(line), process
    finally:
        process.terminate()
        process.wait(10)


def _read_line(process: subprocess.Popen, timeout: float) -> str:
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return found[0] if found else ""


def metric(samples: dict[str, float], name: str, **labels) -> float:
    if not labels:
        return samples[name]
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return samples[f"{name}{{{wanted}}}"]


def sse_events(text: str) -> list[str]:
    return re.findall(r"^data: (.*)$", text, flags=re.MULTILINE)
