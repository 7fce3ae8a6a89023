"""External harnesses: real coding-agent CLIs (Claude Code, Codex, OpenCode, aider, mini-swe-agent)
that swarm launches as agent processes, each pointed at swarm's loopback server.

A template is a YAML file holding one top-level `external:` mapping (harness_templates/codex.yaml),
or the same keys inline under a spec's `harness:`. Its command, env and files may hold placeholders,
a lowercase name in braces, filled in for each agent by `render`:

    {task} {model} {base_url} {api_key} {home} {workspace} {context_tokens} {output_tokens}

`{base_url}` is the server's root (http://127.0.0.1:PORT); OpenAI clients add `/v1` themselves.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from yaml.nodes import MappingNode, Node

from engine import SpecError
from swarm.spec.reader import SpecReader, join

APIS = ("anthropic", "openai-responses", "openai-chat")
TRUNK_SOURCES = ("first-request", "first-request-with-tools")
"""How swarm learns the trunk it computes once and pins: from the first request an agent sends, or its first
request that carries tools (a CLI that first asks for a session title, without them). swarm/run/harness_trunk.py"""
PLACEHOLDERS = ("task", "model", "base_url", "api_key", "home", "workspace", "context_tokens", "output_tokens")
KEYS = ["name", "description", "api", "command", "env", "files", "install", "trunk"]
_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(slots=True)
class ExternalHarness:
    name: str
    api: str
    command: list[str]
    """argv; command[0] is the program, a name looked up on PATH or an absolute path."""
    description: str = ""
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    """Path relative to the agent's home -> the file's text."""
    install: str = ""
    """The one-line command that installs the program, shown when it is missing."""
    trunk: str = "first-request"
    path: Path | None = None
    """The template file; None for a block inline in a spec."""


class HarnessLaunch(NamedTuple):
    """One agent's process: its argv, the variables to set, and the files to write (absolute paths)."""
    argv: list[str]
    env: dict[str, str]
    files: dict[Path, str]


def is_external_file(path: Path) -> bool:
    """A YAML file whose top level holds `external:` (built-in harnesses hold rules and tools)."""
    if path.suffix not in (".yaml", ".yml"):
        return False
    root = SpecReader(path).compose(path.read_text())
    return isinstance(root, MappingNode) and any(key.value == "external" for key, _ in root.value)


def load_external_harness(path: Path) -> ExternalHarness:
    reader = SpecReader(path)
    root = reader.compose(path.read_text())
    if root is None:
        raise SpecError(f"{path}:1: the file is empty; an external harness needs an external: mapping")
    node = reader.mapping(root, "(top level)", ["external"], required=["external"])["external"]
    return read_external_harness(reader, node, "external", path.parent, path)


def read_external_harness(reader: SpecReader, node: Node, key: str, base: Path,
                          path: Path | None = None) -> ExternalHarness:
    """The harness a mapping describes; relative program paths are relative to `base`."""
    values = reader.mapping(node, key, KEYS, required=["api", "command"])
    command = _command(reader, values["command"], join(key, "command"), base)
    default_name = path.stem if path is not None else Path(command[0]).name
    return ExternalHarness(
        name=_text(reader, values.get("name"), join(key, "name")) or default_name,
        api=reader.choice(values["api"], join(key, "api"), APIS),
        command=command,
        description=_text(reader, values.get("description"), join(key, "description")),
        env=_env(reader, values.get("env"), join(key, "env")),
        files=_files(reader, values.get("files"), join(key, "files")),
        install=_text(reader, values.get("install"), join(key, "install")),
        trunk=reader.choice(values["trunk"], join(key, "trunk"), TRUNK_SOURCES) if "trunk" in values
        else TRUNK_SOURCES[0],
        path=path)


def render(harness: ExternalHarness, *, task: str, model: str, base_url: str, api_key: str, home: Path,
           workspace: Path, context_tokens: int, output_tokens: int) -> HarnessLaunch:
    """The harness's command, variables and files for one agent, every placeholder filled in."""
    values = dict(task=task, model=model, base_url=base_url, api_key=api_key, home=str(home),
                  workspace=str(workspace), context_tokens=str(context_tokens), output_tokens=str(output_tokens))

    def fill(text: str, where: str) -> str:
        return _PLACEHOLDER.sub(lambda match: _value(values, match[1], f"{harness.name}: {where}"), text)

    argv = [fill(part, f"command[{i}]") for i, part in enumerate(harness.command)]
    env = {name: fill(value, f"env.{name}") for name, value in harness.env.items()}
    files = {Path(home) / name: fill(text, f"files.{name}") for name, text in harness.files.items()}
    return HarnessLaunch(argv, env, files)


def check_installed(harness: ExternalHarness, search_path: str | None = None) -> str:
    """The program's full path; SpecError with the install command when it is not there."""
    program = harness.command[0]
    found = shutil.which(program, path=search_path)
    if found is not None:
        return found
    how = f"install it with: {harness.install}" if harness.install else "install it or put it on PATH"
    raise SpecError(f"{harness.name}: `{program}` is not installed; {how}")


def _value(values: dict[str, str], name: str, where: str) -> str:
    if name not in values:
        raise SpecError(f"{where}: unknown placeholder {{{name}}}; known: {_known()}")
    return values[name]


def _command(reader: SpecReader, node: Node, key: str, base: Path) -> list[str]:
    items = reader.sequence(node, key)
    if not items:
        raise reader.fail(node, key, "the list is empty; give the program and its arguments")
    command = [_template(reader, item, f"{key}[{i}]") for i, item in enumerate(items)]
    if _PLACEHOLDER.search(command[0]):
        raise reader.fail(items[0], f"{key}[0]", "the program cannot hold a placeholder (swarm checks that it "
                                                 "is installed before any agent exists); name it as is")
    program = Path(command[0]).expanduser()
    if "/" in command[0] and not program.is_absolute():
        program = (base / program).resolve()
    return [str(program) if "/" in command[0] else command[0], *command[1:]]


def _env(reader: SpecReader, node: Node | None, key: str) -> dict[str, str]:
    if node is None:
        return {}
    env = {}
    for name, value in reader.mapping(node, key, _keys_of(node)).items():
        if not _ENV_NAME.match(name):
            raise reader.fail(value, join(key, name), "is not a variable name (letters, digits and '_')")
        env[name] = str(_template(reader, value, join(key, name), (str, int)))
    return env


def _files(reader: SpecReader, node: Node | None, key: str) -> dict[str, str]:
    if node is None:
        return {}
    files = {}
    for name, value in reader.mapping(node, key, _keys_of(node)).items():
        parts = PurePosixPath(name).parts
        if not parts or PurePosixPath(name).is_absolute() or ".." in parts or name.startswith("~"):
            raise reader.fail(value, join(key, name), "name a path inside the agent's home, like .config/x.json")
        files[name] = _template(reader, value, join(key, name))
    return files


def _template(reader: SpecReader, node: Node, key: str, kind: type | tuple[type, ...] = str):
    """A text that may hold placeholders, each of them a known one."""
    value = reader.typed(node, key, kind)
    for name in _PLACEHOLDER.findall(str(value)):
        if name not in PLACEHOLDERS:
            raise reader.fail(node, key, f"unknown placeholder {{{name}}}; known: {_known()}")
    return value


def _text(reader: SpecReader, node: Node | None, key: str) -> str:
    return "" if node is None else reader.typed(node, key, str).strip()


def _keys_of(node: Node) -> list[str]:
    """Every key a free-form mapping holds (reader.mapping still refuses duplicates and non-mappings)."""
    return [str(name.value) for name, _ in node.value] if isinstance(node, MappingNode) else []


def _known() -> str:
    return ", ".join(f"{{{name}}}" for name in PLACEHOLDERS)
