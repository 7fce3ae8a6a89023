"""The tools an agent runs, each confined to the agent's workspace.

A tool is a plain function `tool(workspace, **arguments) -> str`. Its signature is the schema
the harness templates publish (tests/swarm/agents/test_tools.py keeps the two in step). `ToolBox.run`
checks a model's call against that signature, runs it, and turns every failure into a
message the model can act on. `Workspace.resolve` is the one gate every path goes through;
files are then opened beneath the workspace's root without following links (`open_file`), read
line by line in bounded memory (swarm/agents/bounded_read.py), and commands run under a supervisor
that kills everything they start (swarm/agents/command_runner.py).
"""
from __future__ import annotations

import inspect
import math
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from swarm.agents.bounded_read import Line, is_binary, text_lines
from swarm.agents.command_runner import CommandResult, run_supervised
from swarm.agents.tool_calls import ToolCall
from swarm.agents.workspace import ToolError, Workspace
from swarm.agents.workspace_search import compile_pattern, matching_lines

MAX_READ_CHARS = 256 * 1024  # what read_file keeps at most; the ToolBox shows less (max_output_chars)
DEFAULT_COMMAND_TIMEOUT = 30.0


# --- the tools -----------------------------------------------------------------------------

def list_dir(workspace: Workspace, path: str = ".") -> str:
    directory = _existing(workspace, path)
    if not directory.is_dir():
        raise ToolError(f"{path!r} is a file, not a directory; use read_file to read it")
    folder = workspace.open_directory(directory)
    try:
        with os.scandir(folder) as scan:
            entries = [entry.name + ("/" if entry.is_dir() else "")
                       for entry in sorted(scan, key=lambda entry: entry.name)]
    finally:
        os.close(folder)
    if not entries:
        return f"{path!r} is an empty directory"
    return "\n".join(entries)


def read_file(workspace: Workspace, path: str, start_line: int | None = None,
              end_line: int | None = None) -> str:
    first = _check_line_range(start_line, end_line)
    with _open_text_file(workspace, path) as file:
        shown, lines_read = _numbered_lines(file, first, end_line)
    if lines_read == 0:
        return f"{path!r} is empty"
    if not shown:
        raise ToolError(f"start_line {first} is past the end of {path!r}, which has {lines_read} lines")
    return "\n".join(shown)


def search(workspace: Workspace, pattern: str, path: str = ".", glob: str | None = None) -> str:
    hits = matching_lines(workspace, compile_pattern(pattern), _existing(workspace, path), glob)
    if not hits:
        where = f" in files matching {glob!r}" if glob else ""
        return f"no matches for {pattern!r} under {path!r}{where}"
    return "\n".join(hits)


def write_file(workspace: Workspace, path: str, content: str) -> str:
    workspace.require_writable()
    file = workspace.resolve(path)
    if file.is_dir():
        raise ToolError(f"{path!r} is a directory; give the path of a file to write")
    data = content.encode("utf-8")
    with workspace.open_file(file, write=True) as out:
        out.write(data)
    lines = len(content.splitlines())
    return f"wrote {lines} lines ({len(data)} bytes) to {workspace.relative(file)}"


def run_command(workspace: Workspace, command: str, timeout: float = DEFAULT_COMMAND_TIMEOUT) -> str:
    if not 0 < timeout < math.inf:
        raise ToolError(f"timeout must be a positive number of seconds, not {timeout}")
    if "\x00" in command:
        raise ToolError("the command contains a NUL character; remove it")
    result = run_supervised(command, workspace.root, timeout)
    if result.ending == "timed_out":
        raise ToolError(f"command timed out after {timeout:g} s and was killed, with every process it started; "
                        f"run something quicker or pass a larger timeout. Output so far:\n{_command_output(result)}")
    if result.ending == "stopped":
        raise ToolError(f"command was stopped because the run is ending. Output so far:\n{_command_output(result)}")
    return f"exit code: {result.exit_code}\n{_command_output(result)}{_leftovers_note(result.leftovers)}"


TOOLS: dict[str, Callable[..., str]] = {
    tool.__name__: tool for tool in (list_dir, read_file, search, write_file, run_command)}


# --- helpers of the tools ------------------------------------------------------------------

def _existing(workspace: Workspace, path: str) -> Path:
    resolved = workspace.resolve(path)
    if not resolved.exists():
        raise ToolError(f"{path!r} does not exist; use list_dir to see what is there")
    return resolved


def _open_text_file(workspace: Workspace, path: str) -> BinaryIO:
    resolved = _existing(workspace, path)
    if resolved.is_dir():
        raise ToolError(f"{path!r} is a directory; use list_dir to see its contents")
    file = workspace.open_file(resolved)
    if is_binary(file):
        file.close()
        raise ToolError(f"{path!r} is a binary file; only text files can be read")
    return file


def _check_line_range(start_line: int | None, end_line: int | None) -> int:
    first = 1 if start_line is None else start_line
    if first < 1:
        raise ToolError(f"start_line must be 1 or more (lines are numbered from 1), not {first}")
    if end_line is not None and end_line < first:
        raise ToolError(f"end_line {end_line} is before start_line {first}; give end_line >= start_line")
    return first


def _numbered_lines(file: BinaryIO, first: int, last: int | None) -> tuple[list[str], int]:
    """The lines first..last as read_file shows them (at most MAX_READ_CHARS), and how many
    lines were read: all of them when none was shown."""
    shown: list[str] = []
    kept_chars, number = 0, 0
    for line in text_lines(file):
        number = line.number
        if number < first:
            continue
        if last is not None and number > last:
            break
        if kept_chars > MAX_READ_CHARS:
            shown.append(f"[read_file shows at most {MAX_READ_CHARS} characters at once; to see the rest, "
                         f"call read_file with start_line={number}]")
            break
        shown.append(f"{number:>4} | {line.text}{_cut_note(line)}")
        kept_chars += len(shown[-1]) + 1
    return shown, number


def _cut_note(line: Line) -> str:
    return f" [... line cut: {line.cut_bytes} more bytes]" if line.cut_bytes else ""


def _command_output(result: CommandResult) -> str:
    sections = [f"--- {label} ---\n{text.rstrip()}"
                for label, text in (("stdout", result.stdout), ("stderr", result.stderr)) if text.strip()]
    return "\n".join(sections) or "(no output)"


def _leftovers_note(leftovers: int) -> str:
    if not leftovers:
        return ""
    return (f"\n[{leftovers} background process(es) were still running when the command ended and were "
            "killed; a process cannot outlive its run_command call]")


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
        if call.name == "run_command":  # a command's last lines (errors, a test summary) matter most
            return self._cut_middle(output, _continue_hint(call, ok, shown_lines=0)), True
        head = output[:self.max_output_chars]
        if "\n" in head:
            head = head[:head.rindex("\n")]
        hint = _continue_hint(call, ok, shown_lines=head.count("\n") + 1)
        note = f"[output truncated: the last {len(output) - len(head)} of {len(output)} characters were cut. {hint}]"
        return f"{head}\n{note}", True

    def _cut_middle(self, output: str, hint: str) -> str:
        half = self.max_output_chars // 2
        head, tail = output[:half], output[-half:]
        if head.rfind("\n") > half // 2:  # end on a whole line, unless the lines are very long
            head = head[:head.rindex("\n")]
        if -1 < tail.find("\n") < half // 2:
            tail = tail[tail.index("\n") + 1:]
        cut = len(output) - len(head) - len(tail)
        return f"{head}\n[output truncated: {cut} of {len(output)} characters were cut from the middle. {hint}]\n{tail}"


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
