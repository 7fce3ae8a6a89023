"""Each agent of an external harness (a CLI, swarm/spec/external_harness.py), made ready to start: its
key, its copy of the project, a private home with the CLI's config files, and the process that runs
the CLI there against swarm's loopback server.

    <run>/workspaces/<agent>/    the agent's copy of the project (as for built-in agents)
    <run>/homes/<agent>/         HOME for the CLI: its config files, its caches; nothing of the user's
    <run>/agent-<agent>.stdout.log, .stderr.log    what the CLI printed (swarm/run/harness_process.py)

The key is the agent's own, so the server attributes every request to it. Where a mount namespace is
available each CLI sees its workspace at one path and its home at another (swarm/run/workspace_mount.py),
so prompts that name their cwd or home stay alike; elsewhere they name their own, and the server
canonicalizes the requests.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from swarm.agents.workspace import Workspace
from swarm.run.harness_process import HarnessProcess
from swarm.run.setup import agent_workspace
from swarm.run.workspace_mount import confine, seen_paths
from swarm.spec.external_harness import render
from swarm.spec.schema import SwarmSpec

PASSED_VARIABLES = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
"""What a CLI keeps of swarm's environment: enough to find its runtime and speak its locale; no keys,
no user config (a HOME of its own comes from the template)."""


@dataclass(slots=True)
class AgentLaunch:
    agent: str
    key: str
    workspace: Workspace
    home: Path
    process: HarnessProcess
    confinement: str      # workspace_mount: "mount-namespace", or "none"
    seen_workspace: str   # the path the CLI works in


def agent_keys(spec: SwarmSpec) -> dict[str, str]:
    """A fresh key for each agent (agent -> key), which the server knows it by."""
    return {agent.name: f"swarm-{agent.name}-{secrets.token_urlsafe(16)}" for agent in spec.agents}


def prepare_launches(spec: SwarmSpec, run_dir: Path, keys: dict[str, str], base_url: str, model: str,
                     context_tokens: int, output_tokens: int) -> list[AgentLaunch]:
    """One launch per agent, its files written, nothing started."""
    return [_launch(spec, agent, run_dir, keys[agent.name], base_url, model, context_tokens, output_tokens)
            for agent in spec.agents]


def _launch(spec: SwarmSpec, agent, run_dir: Path, key: str, base_url: str, model: str, context_tokens: int,
            output_tokens: int) -> AgentLaunch:
    workspace = agent_workspace(spec, agent, run_dir)
    home = run_dir / "homes" / agent.name
    home.mkdir(parents=True, exist_ok=True)
    seen_root, seen_home = seen_paths(workspace.root, home)
    launch = render(spec.external, task=agent.task, model=model, base_url=base_url, api_key=key, home=Path(seen_home),
                    workspace=Path(seen_root), context_tokens=context_tokens, output_tokens=output_tokens)
    for seen, text in launch.files.items():   # written where the home is, named as the CLI sees them
        path = home / seen.relative_to(seen_home)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    confined = confine(launch.argv, workspace.root, home)
    env = {name: os.environ[name] for name in PASSED_VARIABLES if name in os.environ} | launch.env
    process = HarnessProcess(agent.name, confined.argv, env, confined.cwd, run_dir)
    return AgentLaunch(agent.name, key, workspace, home, process, confined.method, confined.workspace)
