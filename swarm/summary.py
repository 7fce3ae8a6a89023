"""`<run>/summary.json`: how the run went, per agent and for the KV memory, written atomically
(a temporary file renamed over the old one) so a reader never sees half of it.

    {"status": "completed" | "interrupted" | "failed", "run": ..., "model": ..., "device": ...,
     "timings": {...}, "tokens": {...}, "memory": {see swarm/swarm_memory.py},
     "agents": [{"name", "status", "end_reason", "turns", "generated_tokens", ...}]}
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from swarm.agent import Agent
from swarm.swarm_memory import SwarmMemory
from swarm.transcript import transcript_path

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
    trunk_sha256: str = ""
    started_at: str = ""


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
    summary = {
        "status": status,
        "run": info.name,
        "run_dir": str(info.run_dir),
        "spec": info.spec_path,
        "started_at": info.started_at,
        "model": info.model,
        "device": info.device,
        "dtype": info.dtype,
        "weight_bytes": info.weight_bytes,
        "trunk_sha256": info.trunk_sha256,
        "timings": _timings(timings),
        "tokens": {"generated": generated,
                   "tool_results": sum(agent.tool_tokens for agent in agents),
                   "computed": memory.latest.tokens_computed,
                   "decode_tok_per_s": _rate(timings.decode_tokens, timings.decode_seconds)},
        "memory": memory.to_dict(),
        "agents": [_agent(agent, memory, info.run_dir, workspaces.get(agent.name, "")) for agent in agents],
    }
    if error:
        summary["error"] = error
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


def _agent(agent: Agent, memory: SwarmMemory, run_dir: Path, workspace: str) -> dict:
    kv = memory.agents[agent.name]
    data = {
        "name": agent.name,
        "status": agent.state.value,
        "end_reason": agent.end_reason or None,
        "turns": agent.turn,
        "tool_calls": agent.tool_calls,
        "prompt_tokens": len(agent.prompt_ids),
        "generated_tokens": agent.generated_tokens,
        "tool_result_tokens": agent.tool_tokens,
        "context_tokens": agent.context_tokens,
        "seconds": round(agent.seconds, 3),
        "first_token_seconds": _since(agent.started_at, agent.first_token_at),
        "tool_seconds": round(agent.tool_seconds, 3),
        "shared_bytes": kv.peak_shared_bytes,
        "peak_private_bytes": kv.peak_private_bytes,
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
