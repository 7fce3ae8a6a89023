"""What differs between agents and between runs, and the one place it is written: the suffix.

The first user message of each agent carries everything volatile, ordered from what every
agent of a run shares (date, platform, git branch) to what is its own (name, working
directory, context, task), so even the suffixes share a few tokens:

    # Environment
    Date: 2025-06-01 14:03 UTC
    Platform: Linux x86_64
    Git branch: main
    # Agent
    Name: agent-2
    Working directory: /runs/agent-2/workspace
    ticket: 42
    # Task
    Fix the failing test in tests/test_parser.py.

Rules may also name variables as `{{ name }}`; `fill` substitutes them per agent, which
makes the trunk differ between agents (prefix lint reports it).
"""
from __future__ import annotations

import platform as platform_module
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from swarm.spec.schema import AgentSpec

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
RUN_VARIABLES = ("date", "platform", "git_branch")


@dataclass(frozen=True, slots=True)
class Environment:
    date: str
    platform: str
    git_branch: str
    cwd: str

    @classmethod
    def detect(cls, cwd: str | Path, now: datetime | None = None) -> "Environment":
        now = now or datetime.now(timezone.utc)
        return cls(date=now.strftime("%Y-%m-%d %H:%M %Z").strip(),
                   platform=f"{platform_module.system()} {platform_module.machine()}".strip(),
                   git_branch=git_branch(Path(cwd)), cwd=str(cwd))


def git_branch(path: Path) -> str:
    """The branch checked out at `path` (a short commit id when detached; "" outside git)."""
    for folder in [path, *path.parents]:
        head = folder / ".git" / "HEAD"
        if head.is_file():
            ref = head.read_text().strip()
            return ref.removeprefix("ref: refs/heads/") if ref.startswith("ref:") else ref[:12]
    return ""


def agent_variables(agent: AgentSpec, env: Environment) -> dict[str, str]:
    return {**agent.context, "name": agent.name, "task": agent.task, "cwd": env.cwd,
            "date": env.date, "platform": env.platform, "git_branch": env.git_branch}


def fill(text: str, variables: dict[str, str]) -> str:
    """`{{ name }}` replaced by its value; placeholders of unknown variables stay as written."""
    return PLACEHOLDER.sub(lambda m: variables.get(m.group(1), m.group(0)), text)


def placeholders(text: str) -> list[re.Match]:
    return list(PLACEHOLDER.finditer(text))


def first_user_message(agent: AgentSpec, env: Environment) -> str:
    lines = ["# Environment", f"Date: {env.date}", f"Platform: {env.platform}"]
    if env.git_branch:
        lines.append(f"Git branch: {env.git_branch}")
    lines += ["# Agent", f"Name: {agent.name}", f"Working directory: {env.cwd}"]
    lines += [f"{key}: {value}" for key, value in agent.context.items()]
    lines += ["# Task", agent.task]
    return "\n".join(lines)
