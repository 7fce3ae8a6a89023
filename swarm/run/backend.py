"""The seam between one run (swarm/run/phases.py, swarm/run/agent_loop.py) and what carries its
agents' turns to a model: swarm's own engine in this process (`LocalBackend`,
swarm/run/local_backend.py) or an OpenAI-compatible server (`OpenAIBackend`,
swarm/run/openai_backend.py).

    run:      describe -> open -> set_up -> share_trunk -> begin each agent -> loop -> agents_ended -> close
    loop:     poll -> TurnEvents for the agents -> tool work in threads -> extend with the results
    stopping: stop_turns -> partial (what was written of each turn in flight) -> release

The backend owns the transport (an engine sequence per agent, or a message list re-sent every
turn) and where the KV figures come from (`memory`); the agents, their limits and their tools are
the run's. What a backend can know is in its `facts` (swarm/run/facts.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from swarm.agents.agent import Agent
from swarm.agents.progress import PartialTurn, ToolJob, TurnEvent
from swarm.run.facts import BackendFacts
from swarm.run.memory import RunMemory
from swarm.run.setup import SwarmGround
from swarm.run.summary import RunInfo, RunTimings
from swarm.spec.schema import SwarmSpec

Note = Callable[[str], None]


class ContextFull(Exception):
    """A turn's results no longer fit the model's context: the agent is done."""


@dataclass(slots=True)
class FirstTurn:
    """What an agent starts from: the messages its transcript begins with, and its prompt's
    tokens where they are counted before it is sent."""

    messages: list[dict]
    prompt_tokens: int | None = None


class RunBackend(Protocol):
    facts: BackendFacts
    memory: RunMemory
    max_context: int | None
    """The model's context, where the backend knows it (after `open`); a server enforces its own."""

    def describe(self, info: RunInfo) -> None:
        """Fill in what is known before opening (a server's model and address)."""

    def open(self, info: RunInfo, timings: RunTimings, note: Note) -> None:
        """Load the model, or check the server and its model; fill in `info`. The engine's
        steps are counted in `timings` from here on."""

    def set_up(self, spec: SwarmSpec, ground: SwarmGround, info: RunInfo, note: Note) -> dict[str, FirstTurn]:
        """Each agent's prompt: token ids on the trunk (engine), or its messages and the tools (server)."""

    def share_trunk(self, before_step: Callable[[], None], after_step: Callable[[], None]) -> int | None:
        """Prefill the trunk once and pin it, calling back around every engine step; its tokens.
        None where the backend has no trunk to share up front (a server: see facts.leader_first)."""

    def begin(self, agent: Agent) -> list[TurnEvent]:
        """Send the agent's first turn; what is known of it at once (queued, or failed: too long)."""

    def has_work(self) -> bool:
        """A turn is in flight, or events wait to be polled."""

    def poll(self, timeout: float) -> list[TurnEvent]:
        """What happened to the turns in flight: one engine step, or what a server streamed
        within `timeout` seconds."""

    def extend(self, agent: Agent, job: ToolJob) -> int | None:
        """Send the tool results of `job` and start the agent's next turn: the tokens appended
        (None: the next turn's usage counts them). Raises ContextFull when they do not fit."""

    def stop_turns(self) -> list[TurnEvent]:
        """Stop every turn in flight (the run ends); the events that came before they stopped."""

    def partial(self, agent: Agent) -> PartialTurn | None:
        """What the model has written of the agent's turn in flight, if there is one."""

    def release(self, agent: Agent) -> None:
        """The agent has ended: give back what its conversation holds (its KV blocks)."""

    def sample_memory(self) -> None:
        """Read the KV figures now, where reading them is cheap (the engine's accounting); a
        server's are read once a second on their own."""

    def agents_ended(self) -> None:
        """Every agent has ended, or the wall time stopped them: the last figures (a server's page)."""

    def close(self) -> None: ...

