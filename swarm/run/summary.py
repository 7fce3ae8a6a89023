"""`<run>/summary.json`: how the run went, per agent and for the KV memory, written atomically
(a temporary file renamed over the old one) so a reader never sees half of it.

    {"status": "completed" | "wall_time" | "interrupted" | "failed", "run": ..., "model": ...,
     "device": ..., "weight_bytes": ..., "weights": {"total_bytes", "by_format", "label"} | null,
     "timings": {...}, "tokens": {...}, "memory": {see swarm/run/memory.py},
     "agents": [{"name", "status", "end_reason", "turns", "generated_tokens", ...}]}

The status is "running" while the run goes; "wall_time" when limits.wall_time cut agents short.
An agent's end_reason: final_answer (a turn without a tool call), length (a turn cut at
sampling.max_tokens, with no call in it), max_turns, max_tokens (limits.max_tokens),
context_full, wall_time, interrupted (Ctrl-C, SIGTERM) or error. A turn the run cut short
counts in "turns"; its transcript event is marked "partial".

One builder for every backend, showing what its backend can know (swarm/run/facts.py): a run on
a server adds "backend" and the cached-token figures of each turn's usage, and its "memory" comes
from the server's /metrics (swarm/run/server_metrics.py), null where it has none.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from swarm.agents.agent import Agent
from swarm.run.facts import LOCAL_FACTS, BackendFacts
from swarm.run.memory import RunMemory
from swarm.run.transcript import transcript_path

if TYPE_CHECKING:
    from engine import WeightMemory

SUMMARY_FILE = "summary.json"


@dataclass(slots=True)
class RunInfo:
    """What the run is, for the summary and the dashboard header."""

    name: str
    run_dir: Path
    spec_path: str
    model: str = ""
    device: str = ""
    dtype: str = ""
    weight_bytes: int = 0
    weights: WeightMemory | None = None
    """The engine's own count of its weights' bytes, by format (a run on a server has none)."""
    trunk_sha256: str = ""
    started_at: str = ""
    facts: BackendFacts = LOCAL_FACTS
    base_url: str = ""
    """The server's address, for a run on one."""


@dataclass(slots=True)
class RunTimings:
    load_seconds: float = 0.0
    trunk_seconds: float = 0.0
    agents_seconds: float = 0.0
    wall_seconds: float = 0.0
    steps: int = 0
    step_seconds: float = 0.0
    decode_steps: int = 0
    decode_seconds: float = 0.0
    decode_tokens: int = 0


def build_summary(info: RunInfo, status: str, agents: list[Agent], memory: RunMemory,
                  timings: RunTimings, workspaces: dict[str, str], error: str = "") -> dict:
    facts = info.facts
    summary = _run_fields(info, status, timings, error)
    if info.base_url:  # the server it ran on
        summary["backend"] = {"type": facts.kind, "base_url": info.base_url, "model": info.model}
    summary["tokens"] = _tokens(agents, memory, timings, facts)
    summary["memory"] = memory.server_dict() if facts.server_metrics else memory.engine_dict()
    summary["agents"] = [_agent_fields(agent, memory, facts, info.run_dir, workspaces.get(agent.name, ""))
                         for agent in agents]
    return summary


def write_summary(run_dir: Path, summary: dict) -> Path:
    path = run_dir / SUMMARY_FILE
    tmp = path.with_name(f".{SUMMARY_FILE}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as file:
        json.dump(summary, file, indent=2, ensure_ascii=False)
        file.write("\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    return path


def _run_fields(info: RunInfo, status: str, timings: RunTimings, error: str) -> dict:
    fields = {"status": status, "run": info.name, "run_dir": str(info.run_dir), "spec": info.spec_path,
              "started_at": info.started_at, "model": info.model, "device": info.device, "dtype": info.dtype,
              "weight_bytes": info.weight_bytes, "weights": info.weights.to_json() if info.weights else None,
              "trunk_sha256": info.trunk_sha256, "timings": _timings(timings)}
    if error:
        fields["error"] = error
    return fields


def _tokens(agents: list[Agent], memory: RunMemory, timings: RunTimings, facts: BackendFacts) -> dict:
    """Token counts: what the engine computed, or what the servers' usage says it computed."""
    generated = sum(agent.generated_tokens for agent in agents)
    tokens = {"generated": generated, "tool_results": sum(agent.tool_tokens for agent in agents)}
    if facts.cached_tokens:
        prompt, cached = prompt_totals(agents)
        computed = None if cached is None else prompt - cached + generated
        tokens |= {"prompt": prompt, "cached": cached, "computed": computed}
    else:
        tokens["computed"] = memory.latest.tokens_computed
    tokens["decode_tok_per_s"] = (_rate(timings.decode_tokens, timings.decode_seconds) if facts.step_timing
                                  else _rate(generated, timings.agents_seconds))
    return tokens


def prompt_totals(agents: list[Agent]) -> tuple[int, int | None]:
    """The prompt tokens the agents' turns sent, and how many the server had cached (None: it never said)."""
    prompt = sum(agent.usage.prompt_tokens_total for agent in agents)
    cached = [agent.usage.cached_tokens_total for agent in agents if agent.usage.cached_tokens_total is not None]
    return prompt, sum(cached) if cached else None


def _agent_fields(agent: Agent, memory: RunMemory, facts: BackendFacts, run_dir: Path, workspace: str) -> dict:
    data = {
        "name": agent.name,
        "status": agent.state.value,
        "end_reason": agent.end_reason or None,
        "turns": agent.turn,
        "tool_calls": agent.tool_calls,
        "generated_tokens": agent.generated_tokens,
        "tool_result_tokens": agent.tool_tokens,
        "context_tokens": agent.context_tokens,
        "seconds": round(agent.seconds, 3),
        "first_token_seconds": _since(agent.started_at, agent.first_token_at),
        "tool_seconds": round(agent.tool_seconds, 3),
        "prompt_tokens": agent.prompt_tokens,
        **_kv_fields(agent, memory, facts),
        "workspace": workspace,
        "transcript": transcript_path(run_dir, agent.name).name,
    }
    if agent.error:
        data["error"] = agent.error
    return data


def _kv_fields(agent: Agent, memory: RunMemory, facts: BackendFacts) -> dict:
    """The most KV the agent held, where the engine counts it per agent; its cached prompt
    tokens, where each turn's usage says them."""
    fields = {"shared_bytes": None, "peak_private_bytes": None}
    if facts.per_agent_kv_bytes:
        kv = memory.agents[agent.name]
        fields = {"shared_bytes": kv.peak_shared_bytes, "peak_private_bytes": kv.peak_private_bytes}
    if facts.cached_tokens:
        usage = agent.usage
        fields |= {"prompt_tokens_total": usage.prompt_tokens_total, "cached_tokens_total": usage.cached_tokens_total,
                   "first_turn_cached_tokens": usage.first_cached_tokens,
                   "last_turn_prompt_tokens": usage.last_prompt_tokens,
                   "last_turn_cached_tokens": usage.last_cached_tokens}
    return fields


def _timings(timings: RunTimings) -> dict:
    data = {name: getattr(timings, name) for name in timings.__slots__}
    return {name: round(value, 3) if isinstance(value, float) else value for name, value in data.items()}


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 3)


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 2) if seconds > 0 else 0.0
