"""The plain view (`--no-tui`, or output that is not a terminal): one line per event,

    [  12.4s] fixer       tool_call    read_file {"path": "calc.py"}

and, for a run on a server, its KV figures from /metrics every few seconds while they change, and
each agent's cached prompt tokens at the end. The interface the run talks to is swarm/run/view.py.
"""
from __future__ import annotations

import json
import sys
import time
from typing import TextIO

from swarm.agents.agent import Agent, AgentEvent
from swarm.run.memory import MemorySnapshot, RunMemory
from swarm.run.summary import RunInfo, prompt_totals
from swarm.spec.kv_budget import format_bytes

SNIPPET_CHARS = 100
SERVER_LINE_SECONDS = 5.0
NO_CACHED_TOKENS = ("unavailable (the server reports no cached tokens: vLLM needs --enable-prompt-tokens-details, "
                    "SGLang --enable-cache-report)")


class PlainView:
    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.start_time: float | None = None
        self.name_width = 8
        self.info: RunInfo | None = None
        self.memory: RunMemory | None = None
        self.agents: list[Agent] = []
        self.last_line, self.last_time = "", 0.0

    def note(self, text: str) -> None:
        self._print(f"swarm: {text}")

    def start(self, info: RunInfo, agents: list[Agent], memory: RunMemory) -> None:
        self.info, self.agents, self.memory = info, agents, memory
        self.name_width = max([len(agent.name) for agent in agents] + [8])
        weights = f", {describe_weights(info)}" if info.weights else ""
        self.note(f"run {info.name}: {len(agents)} agents, {info.model} {where(info)}{weights}, "
                  f"writing to {info.run_dir}")

    def event(self, event: AgentEvent) -> None:
        if self.start_time is None:
            self.start_time = event.time
        stamp = f"[{event.time - self.start_time:7.1f}s]"
        self._print(f"{stamp} {event.agent:<{self.name_width}} {event.kind:<12} {describe(event)}")

    def refresh(self, tok_per_s: float) -> None:
        """A run on a server: its KV figures, at most every few seconds and only when they changed."""
        if not self.info.facts.server_metrics:
            return
        now = time.monotonic()
        line = self._server_line()
        if line != self.last_line and now - self.last_time >= SERVER_LINE_SECONDS:
            self.note(line)
            self.last_line, self.last_time = line, now

    def close(self, summary: dict) -> None:
        served = "backend" in summary  # a run on a server: each turn's usage says its cached tokens
        for agent in summary["agents"]:
            figures = _prompt_figures(agent) if served else f"context {agent['context_tokens']}"
            self._print(f"{agent['name']:<{self.name_width}} {agent['status']:<11} {agent['end_reason'] or '-':<13} "
                        f"turns {agent['turns']:<3} generated {agent['generated_tokens']:<6} {figures}")
        if served and self.memory is not None:
            self.note(self._server_line())
        shared = describe_agents_cache(self.agents) if served else _trunk_shared(summary["memory"])
        self.note(f"{summary['status']}: {shared}; summary in {summary['run_dir']}/summary.json")

    def _server_line(self) -> str:
        return f"server KV {describe_server_kv(self.memory)} · {describe_server_cache(self.memory)}"

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


def _trunk_shared(memory: dict) -> str:
    return f"trunk {memory['trunk_tokens']} tokens shared, {memory['bytes_saved']} bytes of KV saved at the peak"


def _prompt_figures(agent: dict) -> str:
    cached = agent["cached_tokens_total"]
    return f"prompt {agent['prompt_tokens_total']:<7} cached {'unavailable' if cached is None else cached}"


def where(info: RunInfo) -> str:
    """Where the model runs, in words."""
    if info.base_url:
        return f"on the {info.facts.kind} server {info.base_url}"
    return f"on {info.device} ({info.dtype})"


def describe_weights(info: RunInfo) -> str:
    """The weights the engine holds: "weights 4.92 GB · Q4_K_M" (what the file or the load made them)."""
    if info.weights is None:
        return f"weights {format_bytes(info.weight_bytes)}"
    return f"weights {format_bytes(info.weights.total_bytes)} · {info.weights.label}"


def describe_linear_state(reading: MemorySnapshot) -> str | None:
    """A hybrid model's linear-attention state in words: "3 slots · 154.53 MB · 1 snapshot · 51.51 MB";
    None for a model without it."""
    if not (reading.state_slots or reading.snapshots):
        return None
    snapshots = f"{reading.snapshots} snapshot{'s' if reading.snapshots != 1 else ''}"
    return (f"{reading.state_slots} slot{'s' if reading.state_slots != 1 else ''} · "
            f"{format_bytes(reading.state_slot_bytes)} · {snapshots} · {format_bytes(reading.snapshot_bytes)}")


def describe_server_kv(memory: RunMemory) -> str:
    """The server's KV cache in words, from what its /metrics gives."""
    if not memory.available:
        return f"unavailable ({memory.note})"
    latest, parts = memory.latest, []
    if latest.kv_usage is not None:
        parts.append(f"{latest.kv_usage:.0%} in use (peak {memory.peak.kv_usage or 0:.0%})")
    if latest.kv_used_tokens is not None and latest.kv_total_tokens:
        parts.append(f"{latest.kv_used_tokens:,} of {latest.kv_total_tokens:,} tokens")
    if latest.kv_used_bytes is not None and latest.kv_total_bytes:
        parts.append(f"{format_bytes(latest.kv_used_bytes)} of {format_bytes(latest.kv_total_bytes)}")
    if latest.kv_shared_bytes is not None:
        parts.append(f"shared {format_bytes(latest.kv_shared_bytes)}")
    if latest.kv_saved_bytes is not None:
        parts.append(f"saved {format_bytes(latest.kv_saved_bytes)} against no sharing")
    return " · ".join(parts) or f"unavailable ({memory.latest.source} gives no KV figures)"


def describe_server_cache(memory: RunMemory) -> str:
    latest, rate = memory.latest, memory.prefix_hit_rate

    def count(value: int | None) -> str:
        return "unavailable" if value is None else str(value)
    return (f"prefix hit rate {'unavailable' if rate is None else f'{rate:.0%}'} · "
            f"{count(latest.requests_running)} running · {count(latest.requests_waiting)} waiting")


def describe_agents_cache(agents: list[Agent]) -> str:
    """What the agents' turns found in the server's prefix cache, from each reply's usage."""
    prompt, cached = prompt_totals(agents)
    if not prompt:
        return "no turn finished yet"
    if cached is None:
        return f"{prompt:,} prompt tokens sent; cached {NO_CACHED_TOKENS}"
    return f"{cached:,} of {prompt:,} prompt tokens came from the server's cache ({cached / prompt:.0%})"


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
