"""From a spec to agents ready to start, for every backend: the workspaces, the trunk's rules and
tools (`prepare_ground`), and the `Agent`s with their tool boxes and sampling (`make_agents`). Each
backend makes the prompts its own way (swarm/run/local_backend.py, swarm/run/openai_backend.py).

    <run>/workspaces/<agent>/   each agent's copy of the project (mode "copy")
    ToolBox                     the harness's tools that swarm implements, confined to the workspace
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from engine import EngineOptions, KVFloor, SamplingParams, SpecError
from swarm.agents.agent import Agent, AgentEvent, AgentLimits
from swarm.agents.tools import TOOLS, ToolBox
from swarm.agents.workspace import Workspace, prepare_workspace
from swarm.spec.harness import load_harness
from swarm.spec.kv_budget import run_sequences
from swarm.spec.schema import AgentSpec, SwarmSpec
from swarm.trunk.canonical import TrunkSource, trunk_source
from swarm.trunk.suffix import Environment

TURN_STOP = ["</tool_call>"]
"""A turn ends right after its tool call: the harness asks for one call per turn."""


@dataclass(slots=True)
class SwarmGround:
    """What every backend starts from: the trunk's rules and tools, each agent's workspace and
    environment, and the tools swarm runs for it."""

    source: TrunkSource
    tool_names: list[str]
    workspaces: dict[str, Workspace]
    environments: dict[str, Environment]

    def toolbox(self, spec: SwarmSpec, agent: str) -> ToolBox:
        names = [name for name in self.tool_names if name in TOOLS]
        return ToolBox(self.workspaces[agent], names, allow_commands="run_command" in names,
                       max_command_timeout=spec.run_command.timeout)


def prepare_ground(spec: SwarmSpec, run_dir: Path) -> SwarmGround:
    source = trunk_source(load_harness(spec.harness), spec)
    tool_names = [segment.tool["function"]["name"] for segment in source.tools]
    _check_commands(spec, tool_names)
    workspaces = {agent.name: agent_workspace(spec, agent, run_dir) for agent in spec.agents}
    now = datetime.now(timezone.utc)
    environments = {name: Environment.detect(ws.root, now) for name, ws in workspaces.items()}
    return SwarmGround(source, tool_names, workspaces, environments)


def make_agents(spec: SwarmSpec, ground: SwarmGround, prompt_tokens: dict[str, int | None], max_context: int | None,
                usage: bool, emit: Callable[[AgentEvent], None]) -> list[Agent]:
    """The spec's agents. `usage`: their backend reports each turn's prompt usage (a server)."""
    limits = AgentLimits(spec.limits.max_turns, spec.limits.max_tokens, max_context)
    return [Agent(agent.name, ground.toolbox(spec, agent.name), sampling_params(spec, index), limits, emit,
                  prompt_tokens=prompt_tokens[agent.name], usage=usage)
            for index, agent in enumerate(spec.agents)]


def agent_workspace(spec: SwarmSpec, agent: AgentSpec, run_dir: Path) -> Workspace:
    """The agent's copy of the project under `<run>/workspaces/<agent>` (mode copy), or the shared one."""
    workspace = spec.workspace
    dest = run_dir / "workspaces" / agent.name if workspace.mode == "copy" else None
    return prepare_workspace(workspace.path, dest, workspace.mode)


def _check_commands(spec: SwarmSpec, tool_names: list[str]) -> None:
    if spec.workspace.mode == "shared-readonly" and "run_command" in tool_names:
        raise SpecError(f"{spec.path}: run_command: a shared-readonly workspace cannot run commands "
                        "(they could change it); set run_command.enabled: false or workspace.mode: copy")


def engine_options(spec: SwarmSpec, kv_floor: KVFloor | None = None) -> EngineOptions:
    """The engine the spec asks for: device, dtype, weights, graphs, its KV budget, and as many sequences at once
    as the run has (what a GPU engine sizes its profile step and a hybrid model's state by)."""
    budget = spec.kv_budget
    return EngineOptions(device=spec.device, dtype=spec.dtype, weights=spec.weights, cuda_graphs=spec.graphs,
                         kv_budget_tokens=budget.tokens if budget else None,
                         kv_budget_bytes=budget.bytes if budget else None, kv_floor=kv_floor,
                         max_num_seqs=run_sequences(len(spec.agents)))


def sampling_params(spec: SwarmSpec, index: int) -> SamplingParams:
    """Per-turn sampling; each agent draws from its own seed, so equal tasks still diverge."""
    sampling = spec.sampling
    seed = None if sampling.seed is None else sampling.seed + index
    return SamplingParams(max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                          top_p=max(sampling.top_p, 1e-6), top_k=sampling.top_k, seed=seed, stop=list(TURN_STOP))
