"""How a run shows itself while it goes: the interface the orchestrator talks to, and the plain
view (`--no-tui`, or output that is not a terminal) that prints one line per event:

    [  12.4s] fixer       tool_call    read_file {"path": "calc.py"}

A run on a remote server (`RemotePlainView`) also prints the server's KV figures from its
/metrics every few seconds while they change, and each agent's cached prompt tokens at the end.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Protocol, TextIO

from swarm.agents.agent import Agent, AgentEvent
from swarm.run.memory import SwarmMemory
from swarm.run.remote_agent import RemoteAgent
from swarm.run.server_memory import ServerMemory
from swarm.run.summary import RunInfo
from swarm.spec.kv_budget import format_bytes

SNIPPET_CHARS = 100
SERVER_LINE_SECONDS = 5.0
NO_CACHED_TOKENS = ("unavailable (the server reports no cached tokens: vLLM needs --enable-prompt-tokens-details, "
                    "SGLang --enable-cache-report)")


class RunView(Protocol):
    def note(self, text: str) -> None: ...
    def start(self, info: RunInfo, agents: list[Agent] | list[RemoteAgent],
              memory: SwarmMemory | ServerMemory) -> None: ...
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


class RemotePlainView(PlainView):
    """The plain view of a run on a remote server: what the server says of its KV cache."""

    def __init__(self, stream: TextIO | None = None):
        super().__init__(stream)
        self.server: ServerMemory | None = None
        self.agents: list[RemoteAgent] = []
        self.last_line, self.last_time = "", 0.0

    def start(self, info: RunInfo, agents: list[RemoteAgent], memory: ServerMemory) -> None:
        self.name_width = max([len(agent.name) for agent in agents] + [8])
        self.server, self.agents = memory, agents
        self.note(f"run {info.name}: {len(agents)} agents, {info.model} on the {info.backend} server "
                  f"{info.base_url}, writing to {info.run_dir}")

    def refresh(self, tok_per_s: float) -> None:
        now = time.monotonic()
        line = f"server KV {describe_server_kv(self.server)} · {describe_server_cache(self.server)}"
        if line != self.last_line and now - self.last_time >= SERVER_LINE_SECONDS:
            self.note(line)
            self.last_line, self.last_time = line, now

    def close(self, summary: dict) -> None:
        for agent in summary["agents"]:
            cached = agent["cached_tokens_total"]
            self._print(f"{agent['name']:<{self.name_width}} {agent['status']:<11} {agent['end_reason'] or '-':<13} "
                        f"turns {agent['turns']:<3} generated {agent['generated_tokens']:<6} "
                        f"prompt {agent['prompt_tokens_total']:<7} cached "
                        f"{'unavailable' if cached is None else cached}")
        if self.server is not None:
            self.note(f"server KV {describe_server_kv(self.server)} · {describe_server_cache(self.server)}")
        self.note(f"{summary['status']}: {describe_agents_cache(self.agents)}; summary in "
                  f"{summary['run_dir']}/summary.json")


def describe_server_kv(server: ServerMemory) -> str:
    """The server's KV cache in words, from what its /metrics gives."""
    if not server.available:
        return f"unavailable ({server.note})"
    latest, parts = server.latest, []
    if latest.kv_usage is not None:
        parts.append(f"{latest.kv_usage:.0%} in use (peak {server.peak.kv_usage or 0:.0%})")
    if latest.kv_used_tokens is not None and latest.kv_total_tokens:
        parts.append(f"{latest.kv_used_tokens:,} of {latest.kv_total_tokens:,} tokens")
    if latest.kv_used_bytes is not None and latest.kv_total_bytes:
        parts.append(f"{format_bytes(latest.kv_used_bytes)} of {format_bytes(latest.kv_total_bytes)}")
    if latest.kv_shared_bytes is not None:
        parts.append(f"shared {format_bytes(latest.kv_shared_bytes)}")
    if latest.kv_saved_bytes is not None:
        parts.append(f"saved {format_bytes(latest.kv_saved_bytes)} against no sharing")
    return " · ".join(parts) or f"unavailable ({server.latest.source} gives no KV figures)"


def describe_server_cache(server: ServerMemory) -> str:
    latest, rate = server.latest, server.prefix_hit_rate

    def count(value: int | None) -> str:
        return "unavailable" if value is None else str(value)
    return (f"prefix hit rate {'unavailable' if rate is None else f'{rate:.0%}'} · "
            f"{count(latest.requests_running)} running · {count(latest.requests_waiting)} waiting")


def describe_agents_cache(agents: list[RemoteAgent]) -> str:
    """What the agents' turns found in the server's prefix cache, from each reply's usage."""
    prompt = sum(agent.prompt_tokens_total for agent in agents)
    cached = [agent.cached_tokens_total for agent in agents if agent.cached_tokens_total is not None]
    if not prompt:
        return "no turn finished yet"
    if not cached:
        return f"{prompt:,} prompt tokens sent; cached {NO_CACHED_TOKENS}"
    return f"{sum(cached):,} of {prompt:,} prompt tokens came from the server's cache ({sum(cached) / prompt:.0%})"


def describe(event: AgentEvent) -> str:
    data = event.data
    if event.kind == "message":
        size = f"{data['tokens']} tokens" if "tokens" in data else f"{len(data.get('content', ''))} characters"
        return f"{data['role']} message, {size}"
    if event.kind == "prefilled":
        if "context_tokens" not in data:
            return f"turn {data['turn']}: first token (the server has computed the prompt)"
        return f"prompt computed, context {data['context_tokens']} tokens"
    if event.kind == "assistant":
        partial = " (cut off)" if data.get("partial") else ""
        return f"turn {data['turn']}: {data['tokens']} tokens{partial}{_usage(data)}: {snippet(data['content'])}"
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


def _usage(data: dict) -> str:
    if data.get("prompt_tokens") is None:
        return ""
    cached = data.get("cached_tokens")
    return f", prompt {data['prompt_tokens']} ({'cached unavailable' if cached is None else f'{cached} cached'})"


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
