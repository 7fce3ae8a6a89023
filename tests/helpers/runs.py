"""Shared by the `swarm run` tests: a tiny random model, a short harness, specs on disk, and a
sampler that makes the real engine "generate" scripted text."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from functools import lru_cache
from pathlib import Path

from engine.loading.tokenizer import Tokenizer
from tests.helpers.tiny_models import CHAT_TEMPLATE, build_tokenizer, make_tiny_model

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_WORKSPACE = REPO / "swarm" / "example_workspace"
EOS_ID = 2  # "<|im_end|>" in the tiny tokenizer
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ENV = {**{name: value for name, value in os.environ.items() if name not in ("COLUMNS", "LINES")},
       "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
"""The environment the `swarm` subprocesses of the tests run in: a terminal's size is its pty's, not the COLUMNS
and LINES pytest-xdist sets in its workers."""


def swarm(*args, **kwargs) -> subprocess.Popen:
    """`python -m swarm ARGS` in the repository, its output piped."""
    return subprocess.Popen([sys.executable, "-m", "swarm", *map(str, args)], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


# The reader agent's transcript in the scripted run, the same on every backend: a call, a malformed
# call answered with an error, another call, then its final answer.
READER_EVENTS = ["message", "message", "prefilled",
                 "assistant", "tool_call", "tool_result", "prefilled",
                 "assistant", "tool_error", "prefilled",
                 "assistant", "tool_call", "tool_result", "prefilled",
                 "assistant", "end"]


def read_transcript(path: Path) -> list[dict]:
    """An agent's transcript, one JSON document a line: read as any user would, with json."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


TINY_HARNESS = {
    "name": "tiny",
    "description": "A short harness, so the tiny model's trunk stays small.",
    "rules": ["You are a coding agent.",
              'Call a tool as <tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>.'],
    "tools": [
        {"type": "function", "function": {
            "name": "read_file", "description": "Read a text file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                           "required": ["path"]}}},
        {"type": "function", "function": {
            "name": "write_file", "description": "Write a text file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                            "content": {"type": "string"}},
                           "required": ["content", "path"]}}},
    ],
}


@lru_cache(maxsize=None)
def tiny_model(base: Path) -> Path:
    return make_tiny_model(base / "swarm-run-tiny-llama", "llama")


@lru_cache(maxsize=1)
def tiny_tokenizer() -> Tokenizer:
    return Tokenizer(build_tokenizer(320), CHAT_TEMPLATE, bos_token="<s>", eos_token="<|im_end|>")


def write_run_spec(folder: Path, model: Path, agents: int | list[dict] = 3, max_tokens: int = 48,
                   max_turns: int = 4, temperature: float = 1.0, wall_time: float = 120) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny-harness.json").write_text(json.dumps(TINY_HARNESS, indent=1))
    agents_yaml = json.dumps(agents)
    spec = folder / "swarm.yaml"
    spec.write_text(textwrap.dedent(f"""\
        model: {model}
        device: cpu
        dtype: float32
        kv_budget: 16000
        harness: tiny-harness.json
        task: Fix the failing test.
        agents: {agents_yaml}
        workspace:
          path: {EXAMPLE_WORKSPACE}
          mode: copy
        sampling:
          temperature: {temperature}
          seed: 7
          max_tokens: {max_tokens}
        limits:
          max_turns: {max_turns}
          wall_time: {wall_time}
        run_command:
          enabled: false
        out: runs
        """))
    return spec


PREFILLED_LINE = re.compile(r"^\[[ 0-9.]+s\] \S+ +prefilled ")
"""The plain view's line for an agent's prefilled event (not the note "trunk prefilled")."""


def interrupt_once_decoding(args: list[str], env: dict, agents: int = 2,
                            sig: signal.Signals = signal.SIGINT) -> tuple[int, str, str]:
    """Start `python ARGS`, send `sig` once `agents` agents have prefilled (have their first
    token: they are decoding), and return its exit code, stdout and stderr."""
    process = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    decoding = 0
    for line in process.stdout:
        decoding += bool(PREFILLED_LINE.match(line))
        if decoding == agents:
            break
    process.send_signal(sig)
    try:
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    return process.returncode, stdout, stderr


class ScriptedSampler:
    """Stands in for the engine's sampler: each agent (by request id) "generates" the turns of its
    script, token by token; a turn ends with EOS unless it ends with a tool call (the engine's
    stop string ends those). After the script, every turn is the final answer "done"."""

    def __init__(self, engine, scripts: dict[str, list[str]]):
        self.engine = engine
        self.scripts = {name: list(turns) for name, turns in scripts.items()}
        self.pending: dict[int, list[int]] = {}

    def sample(self, logits, rows) -> list[int]:
        return [self._next(seq_id) for seq_id, _ in rows]

    def forget(self, seq_id: int) -> None:
        self.pending.pop(seq_id, None)

    def agent_of(self, seq_id: int) -> str:
        return self.engine.live[seq_id].request_id

    def _next(self, seq_id: int) -> int:
        if not self.pending.get(seq_id):
            turns = self.scripts.get(self.agent_of(seq_id)) or ["done"]
            text = turns.pop(0)
            tokens = self.engine.tokenizer.encode(text)
            self.pending[seq_id] = tokens if text.endswith("</tool_call>") else tokens + [EOS_ID]
        return self.pending[seq_id].pop(0)


def swarm_in_terminal(*args, columns: int = 180, timeout: float = 180) -> tuple[int, str]:
    """`python -m swarm ARGS` in a pty of 40 rows: its exit status and what the terminal showed, escapes removed."""
    import pexpect

    child = pexpect.spawn(sys.executable, ["-m", "swarm", *map(str, args)], cwd=str(REPO), env=ENV,
                          dimensions=(40, columns), encoding="utf-8", timeout=timeout)
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus, ANSI_ESCAPE.sub("", child.before)
