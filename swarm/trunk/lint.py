"""Prefix lint: find what would break the trunk's byte-identity across agents or runs.

Two checks:
  - `lint_trunk` scans the trunk as written (rules and tools, `{{ variables }}` unfilled) for
    volatile text: dates, times, UUIDs, hex ids, paths, the cwd, the hostname, git branches
    and commits, PIDs, and variables whose value differs per agent or per run. Each finding
    names the file and line it was written on and the token of the trunk it sits at.
  - `find_divergences` compares the agents' real prompts: each agent branches off the
    others at some token; before the end of the system message that means lost sharing.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from engine import Tokenizer
from swarm.trunk.canonical import PromptSet, Segment, TrunkSource, common_prefix_length, tokenize_with_offsets
from swarm.trunk.suffix import PLACEHOLDER, RUN_VARIABLES, fill
from swarm.trunk.volatile_patterns import Volatiles, find_volatile

ADVICE = {
    "date": "a date changes every day; swarm already puts the date in each agent's first message",
    "timestamp": "a timestamp changes every run; leave it out or move it to the task",
    "time": "a clock time changes every run; leave it out of the rules",
    "uuid": "an id generated per run or per agent; move it to the agent's context",
    "hex_id": "a long hex id is usually per run; move it to the agent's context",
    "git_hash": "a commit changes with every commit; leave it out of the rules",
    "git_branch": "the branch differs between checkouts; swarm puts it in each agent's first message",
    "cwd": "the working directory differs per agent and machine; use paths relative to the workspace",
    "home_dir": "a home directory differs per user; use paths relative to the workspace",
    "abs_path": "an absolute path ties the prompt to one machine; use paths relative to the workspace",
    "hostname": "the hostname differs per machine; leave it out of the rules",
    "pid": "a process id changes every run; leave it out of the rules",
    "template_var": "this variable is filled per agent, so agents diverge here; move it to the task or context",
}


@dataclass(slots=True)
class Finding:
    kind: str
    text: str
    source: str
    line: int | None
    token_index: int
    advice: str


@dataclass(slots=True)
class Divergence:
    agent: str
    other: str
    token_index: int
    in_trunk: bool
    reason: str


def lint_trunk(prompts: PromptSet, source: TrunkSource, variables: list[dict[str, str]],
               volatiles: Volatiles | None = None) -> list[Finding]:
    """Findings in the trunk as written; `variables` holds each agent's variables."""
    written = prompts.written
    located = _locate(written.text, source.segments)
    spans = [(m.start(), m.end(), "template_var") for m in PLACEHOLDER.finditer(written.text)
             if _volatile_variable(m.group(1), variables)]
    spans += [span for span in find_volatile(written.text, volatiles)
              if not any(s[0] < span[1] and span[0] < s[1] for s in spans)]
    findings = []
    for start, end, kind in sorted(spans):
        text = written.text[start:end]
        origin, line = _origin(text, start, located, source.segments)
        findings.append(Finding(kind, text, origin, line, written.token_at(start), ADVICE[kind]))
    return findings


def find_divergences(tokenizer: Tokenizer, prompts: PromptSet, source: TrunkSource,
                     variables: list[dict[str, str]]) -> list[Divergence]:
    """Where each agent's prompt leaves the one it shares the most tokens with."""
    agents = prompts.agents
    result = []
    for i, agent in enumerate(agents):
        others = [(common_prefix_length([agent.prompt_ids, other.prompt_ids]), j)
                  for j, other in enumerate(agents) if j != i]
        if not others:
            continue
        index, j = max(others)
        in_trunk = index < len(agent.system_ids)
        reason = (_trunk_reason(tokenizer, agent.system_text, index, source, variables[i], variables[j])
                  if in_trunk else _suffix_reason(tokenizer, agent.suffix_text, index - len(agent.system_ids)))
        result.append(Divergence(agent.name, agents[j].name, index, in_trunk, reason))
    return result


def _volatile_variable(name: str, variables: list[dict[str, str]]) -> bool:
    """Run variables and the cwd change between runs; others count where agents disagree."""
    if name in RUN_VARIABLES or name == "cwd":
        return True
    values = {v.get(name) for v in variables}
    return len(values) > 1 and values != {None}


def _locate(text: str, segments: list[Segment]) -> list[tuple[int, int, Segment]]:
    """Where each segment's text sits in the trunk (segments the template rewrote are left out)."""
    located, cursor = [], 0
    for segment in segments:
        needle = segment.text.strip()
        start = text.find(needle, cursor)
        if start < 0:
            start = text.find(needle)
        if start >= 0:
            located.append((start, start + len(needle), segment))
            cursor = start + len(needle)
    return located


def _origin(text: str, start: int, located, segments: list[Segment]) -> tuple[str, int | None]:
    covering = [seg for s, e, seg in located if s <= start < e]
    holding = covering or [seg for seg in segments if text in seg.text]
    if not holding:
        return "chat template", None
    segment = holding[0]
    return _display(segment.path), _line_in(segment, text)


def _line_in(segment: Segment, text: str) -> int:
    lines = _file_lines(segment.path)
    first, last = segment.lines
    for number in range(first, min(last, len(lines)) + 1):
        if text in lines[number - 1] or text.replace("\\", "\\\\") in lines[number - 1]:
            return number
    return first


@lru_cache(maxsize=32)
def _file_lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _trunk_reason(tokenizer: Tokenizer, system_text: str, index: int, source: TrunkSource,
                  mine: dict[str, str], theirs: dict[str, str]) -> str:
    _, offsets = tokenize_with_offsets(tokenizer, system_text, first=True)
    char = offsets[min(index, len(offsets) - 1)][0]
    for segment in source.rules:
        filled = fill(segment.text, mine).strip()
        start = system_text.find(filled)
        if start <= char < start + len(filled) and start >= 0:
            names = [m.group(1) for m in PLACEHOLDER.finditer(segment.text)
                     if mine.get(m.group(1)) != theirs.get(m.group(1))]
            shown = ", ".join(f"{{{{ {n} }}}}" for n in dict.fromkeys(names)) or "a variable"
            return (f"the rule at {_display(segment.path)}:{segment.lines[0]} fills {shown} "
                    "per agent; move it to the task or the agent's context")
    return "the chat template renders the system message differently for these agents"


def _suffix_reason(tokenizer: Tokenizer, suffix_text: str, index: int) -> str:
    _, offsets = tokenize_with_offsets(tokenizer, suffix_text)
    if index >= len(offsets):
        return "its prompt is a prefix of the other's"
    char = offsets[index][0]
    line = suffix_text[:char].rsplit("\n", 1)[-1] + suffix_text[char:].split("\n", 1)[0]
    label = line.split(":", 1)[0].strip() if ":" in line else line.strip()[:40]
    return f"in its own first message, at {label!r} (after the trunk, as intended)"
