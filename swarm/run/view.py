"""How a run shows itself while it goes: the interface the run talks to. Its views are the
CLI's: the live dashboard (swarm/cli/dashboard.py) and the plain lines (swarm/cli/plain_view.py)."""
from __future__ import annotations

from typing import Protocol

from swarm.agents.agent import Agent, AgentEvent
from swarm.run.memory import RunMemory
from swarm.run.summary import RunInfo


class RunView(Protocol):
    def note(self, text: str) -> None: ...
    def start(self, info: RunInfo, agents: list[Agent], memory: RunMemory) -> None: ...
    def event(self, event: AgentEvent) -> None: ...
    def refresh(self, tok_per_s: float) -> None: ...
    def close(self, summary: dict) -> None: ...
