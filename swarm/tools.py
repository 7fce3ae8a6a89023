"""The tools an agent runs, each confined to the agent's workspace.

A tool is a plain function `tool(workspace, **arguments) -> str`. Its signature is the schema
the harness templates publish (tests/swarm/test_tools.py keeps the two in step). `ToolBox.run`
checks a model's call against that signature, runs it, and turns every failure into a
message the model can act on. `Workspace.resolve` is the one gate every path goes through.
"""
from __future__ import annotations

import inspect
import os
import re
import signal
import subprocess
import typing
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

from swarm.tool_calls import ToolCall
from swarm.workspace import ToolError, Workspace

SKIPPED_DIRS = {".git", "__pycache__", ".hypothesis", ".pytest_cache"}
BINARY_SNIFF_BYTES = 8192
MAX_SEARCH_LINE_CHARS = 300
DEFAULT_COMMAND_TIMEOUT = 30.0


# --- the tools -----------------------------------------------------------------------------

def list_dir(workspace: Workspace, path: str = ".") -> str:
    directory = _existing(workspace, path)
    if not directory.is_dir():
        raise ToolError(f"{path!r} is a file, not a directory; use read_file to read it")
    entries = sorted(directory.iterdir(), key=lambda entry: entry.name)
    if not entries:
        return f"{path!r} is an empty directory"
    return "\n".join(entry.name + ("/" if entry.is_dir() else "") for entry in entries)


def read_file(workspace: Workspace, path: str, start_line: int | None = None,
              end_line: int | None = None) -> str:
    lines = _read_text(_existing_file(workspace, path), path).splitlines()
    if not lines:
        return f"{path!r} is empty"
    first, last = _line_range(path, len(lines), start_line, end_line)
    return "\n".join(f"{number:>4} | {lines[number - 1]}" for number in range(first, last + 1))


def search(workspace: Workspace, pattern: str, path: str = ".", glob: str | None = None) -> str:
    regex = _compile(pattern)
    hits = [f"{workspace.relative(file)}:{number}: {_clip(line)}"
            for file in _files_under(workspace, _existing(workspace, path), glob)
            for number, line in _matching_lines(file, regex)]
    if not hits:
        where = f" in files matching {glob!r}" if glob else ""
        return f"no matches for {pattern!r} under {path!r}{where}"
    return "\n".join(hits)


def write_file(workspace: Workspace, path: str, content: str) -> str:
    workspace.require_writable()
    file = workspace.resolve(path)
    if file.is_dir():
        raise ToolError(f"{path!r} is a directory; give the path of a file to write")
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(content, encoding="utf-8")
    lines = len(content.splitlines())
    return f"wrote {lines} lines ({len(content.encode())} bytes) to {workspace.relative(file)}"


def run_command(workspace: Workspace, command: str, timeout: float = DEFAULT_COMMAND_TIMEOUT) -> str:
    if timeout <= 0:
        raise ToolError(f"timeout must be a positive number of seconds, not {timeout}")
    process = subprocess.Popen(command, shell=True, cwd=workspace.root, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise ToolError(f"command timed out after {timeout:g} s and was killed; run something quicker "
                        f"or pass a larger timeout. Output so far:\n{_command_output(stdout, stderr)}") from None
    return f"exit code: {process.returncode}\n{_command_output(stdout, stderr)}"


TOOLS: dict[str, Callable[..., str]] = {
    tool.__name__: tool for tool in (list_dir, read_file, search, write_file, run_command)}
READ_ONLY_TOOLS = ("list_dir", "read_file", "search")


# --- helpers of the tools ------------------------------------------------------------------

def _existing(workspace: Workspace, path: str) -> Path:
    resolved = workspace.resolve(path)
    if not resolved.exists():
        raise ToolError(f"{path!r} does not exist; use list_dir to see what is there")
    return resolved


def _existing_file(workspace: Workspace, path: str) -> Path:
    file = _existing(workspace, path)
    if file.is_dir():
        raise ToolError(f"{path!r} is a directory; use list_dir to see its contents")
    return file


def _read_text(file: Path, shown_path: str) -> str:
    data = file.read_bytes()
    if _is_binary(data):
        raise ToolError(f"{shown_path!r} is a binary file; only text files can be read")
    return data.decode("utf-8", errors="replace")


def _is_binary(data: bytes) -> bool:
    return b"\x00" in data[:BINARY_SNIFF_BYTES]


def _line_range(path: str, total: int, start_line: int | None, end_line: int | None) -> tuple[int, int]:
    first = 1 if start_line is None else start_line
    last = total if end_line is None else min(end_line, total)
    if first < 1:
        raise ToolError(f"start_line must be 1 or more (lines are numbered from 1), not {first}")
    if first > total:
        raise ToolError(f"start_line {first} is past the end of {path!r}, which has {total} lines")
    if last < first:
        raise ToolError(f"end_line {end_line} is before start_line {first}; give end_line >= start_line")
    return first, last


def _compile(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise ToolError(f"pattern {pattern!r} is not a valid Python regular expression: {err}") from None


def _files_under(workspace: Workspace, base: Path, glob: str | None) -> Iterator[Path]:
    files = [base] if base.is_file() else _walk_files(base)
    for file in files:
        if workspace.contains(Path(os.path.realpath(file))) and _glob_matches(workspace.relative(file), glob):
            yield file


def _walk_files(base: Path) -> Iterator[Path]:
    for directory, subdirectories, names in os.walk(base):  # does not descend into symlinked dirs
        subdirectories[:] = sorted(name for name in subdirectories if name not in SKIPPED_DIRS)
        yield from (Path(directory, name) for name in sorted(names))


def _glob_matches(relative_path: str, glob: str | None) -> bool:
    if not glob:
        return True
    name = PurePosixPath(relative_path).name
    return any(fnmatch(candidate, pattern) for candidate in (relative_path, name)
               for pattern in (glob, glob.removeprefix("**/")))


def _matching_lines(file: Path, regex: re.Pattern) -> list[tuple[int, str]]:
    try:
        data = file.read_bytes()
    except OSError:
        return []
    if _is_binary(data):
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return [(number, line) for number, line in enumerate(lines, start=1) if regex.search(line)]


def _clip(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_SEARCH_LINE_CHARS else line[:MAX_SEARCH_LINE_CHARS] + " ..."


def _command_output(stdout: bytes, stderr: bytes) -> str:
    sections = [f"--- {label} ---\n{data.decode('utf-8', errors='replace').rstrip()}"
                for label, data in (("stdout", stdout), ("stderr", stderr)) if data.strip()]
    return "\n".join(sections) or "(no output)"


# --- checking and running a model's call ---------------------------------------------------

@dataclass(slots=True)
class ToolResult:
    name: str
    ok: bool
    output: str
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class ToolParam:
    name: str
    types: tuple[type, ...]
    required: bool


def tool_params(name: str) -> list[ToolParam]:
    """The arguments a tool takes, read from its signature (the workspace excluded)."""
    function = TOOLS[name]
    hints = typing.get_type_hints(function)
    params = list(inspect.signature(function).parameters.values())[1:]
    return [ToolParam(param.name, typing.get_args(hints[param.name]) or (hints[param.name],),
                      param.default is inspect.Parameter.empty) for param in params]


class ToolBox:
    """Runs a model's tool calls in one workspace. `run` never raises: every failure becomes
    a result with ok=False and a message that tells the model what to change."""

    def __init__(self, workspace: Workspace, tool_names: typing.Iterable[str] | None = None, *,
                 allow_commands: bool = False, max_output_chars: int = 8000,
                 max_command_timeout: float = 120.0):
        self.workspace = workspace
        default_names = [name for name in TOOLS if allow_commands or name != "run_command"]
        self.names = tuple(tool_names if tool_names is not None else default_names)
        self.allow_commands = allow_commands
        self.max_output_chars = max_output_chars
        self.max_command_timeout = max_command_timeout
        assert set(self.names) <= set(TOOLS), f"unknown tools {set(self.names) - set(TOOLS)}"
        assert not (allow_commands and workspace.read_only), "commands could write a read-only workspace"

    def run(self, call: ToolCall) -> ToolResult:
        try:
            output, ok = self._call(call), True
        except ToolError as err:
            output, ok = f"error: {err}", False
        except OSError as err:
            output, ok = f"error: {call.name} failed: {err.strerror or err}", False
        except Exception as err:  # a bug in a tool must not end the agent's run
            output, ok = f"error: {call.name} failed unexpectedly: {type(err).__name__}: {err}", False
        output, truncated = self._truncate(output, call, ok)
        return ToolResult(name=call.name, ok=ok, output=output, truncated=truncated)

    def _call(self, call: ToolCall) -> str:
        self._check_available(call.name)
        _check_arguments(call.name, call.arguments)
        arguments = dict(call.arguments)
        if call.name == "run_command":
            arguments["timeout"] = min(arguments.get("timeout", DEFAULT_COMMAND_TIMEOUT), self.max_command_timeout)
        return TOOLS[call.name](self.workspace, **arguments)

    def _check_available(self, name: str) -> None:
        available = ", ".join(self.names)
        if name not in TOOLS:
            raise ToolError(f"unknown tool {name!r}; the tools you can call are: {available}")
        if name == "run_command" and not self.allow_commands:
            raise ToolError("run_command is disabled for this agent: running commands is not allowed here. "
                            f"The tools you can call are: {available}")
        if name not in self.names:
            raise ToolError(f"tool {name!r} is not available to you; the tools you can call are: {available}")

    def _truncate(self, output: str, call: ToolCall, ok: bool) -> tuple[str, bool]:
        if len(output) <= self.max_output_chars:
            return output, False
        head = output[:self.max_output_chars]
        if "\n" in head:
            head = head[:head.rindex("\n")]
        hint = _continue_hint(call, ok, shown_lines=head.count("\n") + 1)
        note = f"[output truncated: the last {len(output) - len(head)} of {len(output)} characters were cut. {hint}]"
        return f"{head}\n{note}", True


def _check_arguments(name: str, arguments: object) -> None:
    if not isinstance(arguments, dict):
        raise ToolError(f"the arguments of {name} must be a JSON object; usage: {usage(name)}")
    params = {param.name: param for param in tool_params(name)}
    unknown = [key for key in arguments if key not in params]
    if unknown:
        raise ToolError(f"{name} has no argument {', '.join(map(repr, unknown))}; usage: {usage(name)}")
    missing = [param.name for param in params.values() if param.required and param.name not in arguments]
    if missing:
        raise ToolError(f"{name} is missing the required argument {', '.join(map(repr, missing))}; "
                        f"usage: {usage(name)}")
    for key, value in arguments.items():
        if not any(_is_of_type(value, expected) for expected in params[key].types):
            raise ToolError(f"argument {key!r} of {name} must be {_type_names(params[key].types)}, "
                            f"not {_type_names((type(value),))} {_short_repr(value)}; usage: {usage(name)}")


def usage(name: str) -> str:
    """How to call a tool, in the JSON the model writes: read_file {"path": <string>, ...}."""
    fields = [f'"{param.name}": <{_type_names(param.types)}{"" if param.required else ", optional"}>'
              for param in tool_params(name)]
    return f"{name} {{{', '.join(fields)}}}"


JSON_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean",
                   type(None): "null", list: "array", dict: "object"}


def _is_of_type(value: object, expected: type) -> bool:
    if isinstance(value, bool) or expected is bool:
        return type(value) is expected
    if expected is float:
        return isinstance(value, (int, float))
    return isinstance(value, expected)


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join(JSON_TYPE_NAMES.get(kind, kind.__name__) for kind in types)


def _short_repr(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _continue_hint(call: ToolCall, ok: bool, shown_lines: int) -> str:
    if call.name == "read_file" and ok:
        next_line = (call.arguments.get("start_line") or 1) + shown_lines
        return (f"Lines up to {next_line - 1} were shown; to see the rest, call read_file "
                f"with start_line={next_line} (and an end_line).")
    hints = {
        "list_dir": "List a subdirectory to see fewer entries at once.",
        "search": "Narrow the search with a more specific pattern, a path or a glob.",
        "run_command": "Redirect the output to a file (command > out.txt 2>&1) and read it with read_file "
                       "line ranges, or pipe it through head, tail or grep.",
    }
    return hints.get(call.name, "Ask for less output at once.")
