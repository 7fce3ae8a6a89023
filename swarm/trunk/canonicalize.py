"""`swarm serve --canonicalize`: what is known to change between agents or runs, moved out of a
harness's system text into its first user message, so the system text (and the tools before it)
is one trunk for every agent of that harness. The moved text is kept, under a short header:

    system:  ...rules... <env> cwd, date </env> ...rules... gitStatus: ...   ->  ...rules... ...rules...
    user:    Add a subtract function                                        ->  MOVED_HEADER
                                                                                 <env> cwd, date </env>
                                                                                 gitStatus: ...
                                                                                 Add a subtract function
The rules are data, one function per family:
  - BLOCKS: a harness's known sections, moved whole (OpenCode's and older Claude Code's `<env>`,
    Claude Code's `gitStatus:` and its `x-anthropic-billing-header`, whose hex changes per prompt);
  - LINES: known lines (Claude Code's `# Environment` items and its memory path, which holds the
    cwd; aider's platform and date lines);
  - LINT_KINDS: any other line where prefix lint's patterns (swarm/trunk/volatile_patterns.py) find
    a date, a time, an id, a commit or an absolute path.
A text with no finding comes back as it was. swarm/server/canonicalize.py applies this to the
system and developer messages a request starts with, and moves the text into its first user message.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from swarm.trunk.volatile_patterns import find_volatile

MOVED_HEADER = "# Moved here from the system prompt (swarm serve --canonicalize)"
_LINE_END = r"[^\n]*(?:\n|\Z)"
BLOCKS: list[tuple[str, re.Pattern]] = [
    ("env_block", re.compile(r"^[ \t]*<env>\n.*?</env>[ \t]*(?:\n|\Z)", re.S | re.M)),
    ("billing_header", re.compile(rf"^x-anthropic-billing-header:{_LINE_END}", re.M)),
    ("git_status", re.compile(r"^gitStatus: .*?(?:(?=\n\n(?:#+ |<\w))|\Z)", re.S | re.M)),
]
LINES: list[tuple[str, re.Pattern]] = [
    ("claude_code_env", re.compile(r"^ - (?:Primary working directory|Additional working directories|"
                                   rf"Is a git repository|Platform|Shell|OS Version|Today's date):{_LINE_END}",
                                   re.M)),
    ("claude_code_memory", re.compile(rf"^[^\n]*/\.claude/projects/{_LINE_END}", re.M)),
    ("aider_env", re.compile(rf"^- (?:Platform|Current date|Shell): {_LINE_END}", re.M)),
]
LINT_KINDS = ("date", "timestamp", "time", "uuid", "hex_id", "git_hash", "abs_path")
_SHARED_PATH = re.compile(r"^(?:/(?:bin|sbin|usr|etc|dev|proc|sys|lib)(?:/|$)|[A-Za-z]:\\)")
"""Paths the same on every machine (/bin/bash), or a Windows example in a prompt's prose."""


@dataclass(frozen=True, slots=True)
class Move:
    rule: str
    text: str


def find_blocks(text: str) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), rule) for rule, pattern in BLOCKS for m in pattern.finditer(text)]


def find_lines(text: str) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), rule) for rule, pattern in LINES for m in pattern.finditer(text)]


def find_lint(text: str) -> list[tuple[int, int, str]]:
    """Each line holding something prefix lint calls volatile, as (start, end, "lint:<kind>")."""
    spans = []
    for start, end, kind in find_volatile(text):
        if kind not in LINT_KINDS or (kind == "abs_path" and _SHARED_PATH.match(text[start:end])):
            continue
        line_start = text.rfind("\n", 0, start) + 1
        newline = text.find("\n", end)
        spans.append((line_start, len(text) if newline < 0 else newline + 1, f"lint:{kind}"))
    return spans


FAMILIES = (find_blocks, find_lines, find_lint)
"""In order of precedence: a span overlapping one found before is left to it."""


def moved_spans(text: str) -> list[tuple[int, int, str]]:
    spans: list[tuple[int, int, str]] = []
    for family in FAMILIES:
        for span in sorted(family(text)):
            if not any(span[0] < kept[1] and kept[0] < span[1] for kept in spans):
                spans.append(span)
    return sorted(spans)


def canonical_text(text: str) -> tuple[str, list[Move]]:
    """`text` without its volatile spans, and the spans moved out, in text order."""
    spans = moved_spans(text)
    if not spans:
        return text, []
    kept, cursor = "", 0
    for start, end, _ in spans:
        kept += text[cursor:start]
        cursor = end
        if kept.endswith("\n\n") or not kept:  # the cut left a blank line above: drop the one below
            cursor += len(text[cursor:]) - len(text[cursor:].lstrip("\n"))
    kept += text[cursor:]
    return (kept.rstrip("\n") if spans[-1][1] == len(text) else kept,
            [Move(rule, text[start:end].strip("\n")) for start, end, rule in spans])
