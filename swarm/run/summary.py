"""`<run>/summary.json`: how the run went, per agent and for the KV memory, written atomically
(a temporary file renamed over the old one) so a reader never sees half of it.

    {"status": "completed" | "wall_time" | "interrupted" | "failed", "run": ..., "model": ...,
     "device": ..., "timings": {...}, "tokens": {...}, "memory": {see swarm/run/memory.py},
     "agents": [{"name", "status", "end_reason", "turns", "generated_tokens", ...}]}

The status is "running" while the run goes; "wall_time" when limits.wall_time cut agents short.
An agent's end_reason: final_answer (a turn without a tool call), length (a turn cut at
sampling.max_tokens, with no call in it), max_turns, max_tokens (limits.max_tokens),
context_full, wall_time, interrupted (Ctrl-C, SIGTERM) or error. A turn the run cut short
counts in "turns"; its transcript event is marked "partial".

A run on a remote server (swarm/run/remote_run.py) adds "backend" and cached-token figures, and its
"memory" comes from the server's /metrics (swarm/run/server_memory.py), null where it has none.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from swarm.agents.agent import Agent
from swarm.agents.progress import AgentProgress
from swarm.run.memory import SwarmMemory
from swarm.run.remote_agent import RemoteAgent
from swarm.run.server_memory import ServerMemory
from swarm.run.transcript import transcript_path

SUMMARY_FILE = "summary.json"
LOCAL_ONLY_MEMORY = ("block_size", "block_bytes", "bytes_per_token", "trunk_tokens", "trunk_blocks",
                     "trunk_bytes", "peak_private_bytes", "bytes_saved")
"""Memory figures only swarm's own engine knows; null in a remote run's summary."""


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
    trunk_sha256: str = ""
    started_at: str = ""
    backend: str = "local"
    base_url: str = ""


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


def build_summary(info: RunInfo, status: str, agents: list[Agent], memory: SwarmMemory,
                  timings: RunTimings, workspaces: dict[str, str], error: str = "") -> dict:
    generated = sum(agent.generated_tokens for agent in agents)
    summary = _run_fields(info, status, timings, error)
    summary["tokens"] = {"generated": generated,
                         "tool_results": sum(agent.tool_tokens for agent in agents),
                         "computed": memory.latest.tokens_computed,
                         "decode_tok_per_s": _rate(timings.decode_tokens, timings.decode_seconds)}
    summary["memory"] = memory.to_dict()
    summary["agents"] = [_agent(agent, memory, info.run_dir, workspaces.get(agent.name, "")) for agent in agents]
    return summary


def build_remote_summary(info: RunInfo, status: str, agents: list[RemoteAgent], server: ServerMemory,
                         timings: RunTimings, workspaces: dict[str, str], error: str = "") -> dict:
    """The same document for a run on a remote server: token figures from each turn's usage,
    memory figures from the server's /metrics, null where the server does not give them."""
    generated = sum(agent.generated_tokens for agent in agents)
    prompt = sum(agent.prompt_tokens_total for agent in agents)
    cached = [agent.cached_tokens_total for agent in agents if agent.cached_tokens_total is not None]
    summary = _run_fields(info, status, timings, error)
    summary["backend"] = {"type": info.backend, "base_url": info.base_url, "model": info.model}
    summary["tokens"] = {"generated": generated, "tool_results": sum(agent.tool_tokens for agent in agents),
                         "prompt": prompt, "cached": sum(cached) if cached else None,
                         "computed": prompt - sum(cached) + generated if cached else None,
                         "decode_tok_per_s": _rate(generated, timings.agents_seconds)}
    summary["memory"] = dict.fromkeys(LOCAL_ONLY_MEMORY) | server.to_dict()
    summary["agents"] = [_remote_agent(agent, info.run_dir, workspaces.get(agent.name, "")) for agent in agents]
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
              "weight_bytes": info.weight_bytes, "trunk_sha256": info.trunk_sha256, "timings": _timings(timings)}
    if error:
        fields["error"] = error
    return fields


def _agent(agent: Agent, memory: SwarmMemory, run_dir: Path, workspace: str) -> dict:
    kv = memory.agents[agent.name]
    return _agent_fields(agent, run_dir, workspace, prompt_tokens=len(agent.prompt_ids),
                         shared_bytes=kv.peak_shared_bytes, peak_private_bytes=kv.peak_private_bytes)


def _remote_agent(agent: RemoteAgent, run_dir: Path, workspace: str) -> dict:
    """Per-agent KV bytes are known to the local engine only: null here; cached tokens instead."""
    return _agent_fields(agent, run_dir, workspace, prompt_tokens=agent.prompt_tokens,
                         shared_bytes=None, peak_private_bytes=None,
                         prompt_tokens_total=agent.prompt_tokens_total,
                         cached_tokens_total=agent.cached_tokens_total,
                         first_turn_cached_tokens=agent.first_cached_tokens,
                         last_turn_prompt_tokens=agent.last_prompt_tokens,
                         last_turn_cached_tokens=agent.last_cached_tokens)


def _agent_fields(agent: AgentProgress, run_dir: Path, workspace: str, **backend_fields) -> dict:
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
        **backend_fields,
        "workspace": workspace,
        "transcript": transcript_path(run_dir, agent.name).name,
    }
    if agent.error:
        data["error"] = agent.error
    return data


def _timings(timings: RunTimings) -> dict:
    data = {name: getattr(timings, name) for name in timings.__slots__}
    return {name: round(value, 3) if isinstance(value, float) else value for name, value in data.items()}


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 3)


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 2) if seconds > 0 else 0.0
