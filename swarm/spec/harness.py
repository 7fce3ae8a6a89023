"""Harness templates: the fixed rules and tool schemas every agent of a swarm shares.

A harness is a data file, `{"name", "description", "rules": [str], "tools": [OpenAI
function schemas]}`, named by its file stem in `harness_templates/` or given by path.
The same folder holds external harnesses, CLIs swarm launches as agents (a YAML file with a
top-level `external:`); swarm/spec/external_harness.py reads those.
"""
from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import harness_templates
from engine import SpecError
from swarm.spec.reader import SpecReader
from swarm.spec.tool_schema import canonical_tools, tool_name

TEMPLATES_DIR = Path(list(harness_templates.__path__)[0])
_SUFFIXES = (".json", ".yaml", ".yml")


@dataclass(slots=True)
class Harness:
    name: str
    description: str
    rules: list[str]
    tools: list[dict]
    path: Path
    rule_lines: list[int]
    tool_lines: dict[str, int]
    """The line of each rule, and of each tool's name, in `path` (1 where it cannot be found)."""


def available_harnesses() -> list[str]:
    """Every template's name, built-in and external alike."""
    return sorted(p.stem for p in TEMPLATES_DIR.iterdir() if p.suffix in _SUFFIXES)


def resolve_harness(ref: str, base_dir: Path) -> Path:
    """The file a harness reference names; ValueError with a hint when there is none."""
    if _looks_like_path(ref):
        path = (base_dir / Path(ref).expanduser()).resolve()
        if not path.is_file():
            raise ValueError(f"no harness file {ref!r} (looked at {path})")
        return path
    for suffix in _SUFFIXES:
        path = TEMPLATES_DIR / f"{ref}{suffix}"
        if path.is_file():
            return path
    names = available_harnesses()
    close = difflib.get_close_matches(ref, names, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else f"; available: {', '.join(names) or 'none'}"
    raise ValueError(f"no harness template named {ref!r}{hint}")


def load_harness(path: Path) -> Harness:
    raw = _read(path)
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: a harness must be a mapping with name, rules and tools")
    unknown = set(raw) - {"name", "description", "rules", "tools"}
    if unknown:
        raise SpecError(f"{path}: unknown harness keys {sorted(unknown)}; "
                        "allowed: name, description, rules, tools")
    rules = raw.get("rules", [])
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise SpecError(f"{path}: rules must be a list of strings")
    try:
        tools = canonical_tools(raw.get("tools", []) or [])
    except ValueError as err:
        raise SpecError(f"{path}: tools: {err}") from None
    text = path.read_text()
    return Harness(name=str(raw.get("name", path.stem)), description=str(raw.get("description", "")),
                   rules=list(rules), tools=tools, path=path,
                   rule_lines=[_line_of(text, json.dumps(rule, ensure_ascii=False)) for rule in rules],
                   tool_lines={tool_name(t): _tool_line(text, tool_name(t)) for t in tools})


def _read(path: Path):
    text = path.read_text()
    if path.suffix != ".json":
        reader = SpecReader(path)  # refuses YAML alias bombs, like a spec's
        root = reader.compose(text)
        return None if root is None else reader.value(root, "(top level)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None


def _line_of(text: str, needle: str) -> int:
    found = text.find(needle)
    if found < 0:
        found = text.find(needle.strip('"'))
    return text.count("\n", 0, found) + 1 if found >= 0 else 1


def _tool_line(text: str, name: str) -> int:
    match = re.search(r'"?name"?\s*:\s*"?' + re.escape(name) + r'\b', text)
    return text.count("\n", 0, match.start()) + 1 if match else 1


def _looks_like_path(ref: str) -> bool:
    return "/" in ref or "\\" in ref or ref.endswith(_SUFFIXES) or ref.startswith(("~", "."))
