"""How a run shows itself while it goes: the interface the orchestrator talks to, and the plain
view (`--no-tui`, or output that is not a terminal) that prints one line per event:

    [  12.4s] fixer       tool_call    read_file {"path": "calc.py"}
"""
from __future__ import annotations

import json
import sys
from typing import Protocol, TextIO

from swarm.agent import Agent, AgentEvent
from swarm.summary import RunInfo
from swarm.swarm_memory import SwarmMemory

SNIPPET_CHARS = 100


class RunView(Protocol):
    def note(self, text: str) -> None: ...
    def start(self, info: RunInfo, agents: list[Agent], memory: SwarmMemory) -> None: ...
    def event(self, event: AgentEvent) -> None: ...
    def refresh(self, tok_per_s: float) -> None: ...
    def close(self, summary: dict) -> None: ...


class PlainView:
    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.start_time: float | None = None
        self.name_width = 8

    def note(self, text: str) -> None:
        self._print(f"swarm: {text}")

    def start(self, info: RunInfo, agents: list[Agent], memory: SwarmMemory) -> None:
        self.name_width = max([len(agent.name) for agent in agents] + [8])
        self.note(f"run {info.name}: {len(agents)} agents, {info.model} on {info.device} ({info.dtype}), "
                  f"writing to {info.run_dir}")

    def event(self, event: AgentEvent) -> None:
        if self.start_time is None:
            self.start_time = event.time
        stamp = f"[{event.time - self.start_time:7.1f}s]"
        self._print(f"{stamp} {event.agent:<{self.name_width}} {event.kind:<12} {describe(event)}")

    def refresh(self, tok_per_s: float) -> None:
        pass

    def close(self, summary: dict) -> None:
        for agent in summary["agents"]:
            self._print(f"{agent['name']:<{self.name_width}} {agent['status']:<11} {agent['end_reason'] or '-':<13} "
                        f"turns {agent['turns']:<3} generated {agent['generated_tokens']:<6} "
                        f"context {agent['context_tokens']}")
        memory = summary["memory"]
        self.note(f"{summary['status']}: trunk {memory['trunk_tokens']} tokens shared, "
                  f"{memory['bytes_saved']} bytes of KV saved at the peak; summary in "
                  f"{summary['run_dir']}/summary.json")

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


def describe(event: AgentEvent) -> str:
    data = event.data
    if event.kind == "message":
        return f"{data['role']} message, {data.get('tokens', 0)} tokens"
    if event.kind == "prefilled":
        return f"prompt computed, context {data['context_tokens']} tokens"
    if event.kind == "assistant":
        partial = " (cut off)" if data.get("partial") else ""
        return f"turn {data['turn']}: {data['tokens']} tokens{partial}: {snippet(data['content'])}"
    if event.kind == "tool_call":
        return f"{data['name']} {snippet(json.dumps(data['arguments'], ensure_ascii=False))}"
    if event.kind == "tool_error":
        return snippet(data["error"])
    if event.kind == "tool_result":
        status = "ok" if data["ok"] else "failed"
        return f"{data['name']} {status}: {snippet(data['output'])}"
    if event.kind == "end":
        return (f"{data['status']} ({data['reason']}) after {data['turns']} turns, "
                f"{data['generated_tokens']} tokens generated")
    return snippet(json.dumps(data, ensure_ascii=False))


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
