"""The Responses API's tools as the model sees them, and the names that take its calls back.

    client's tools                              model sees (OpenAI function tools)
    {type function, name "exec_command"}    ->  exec_command
    {type function, name "github.open"}     ->  github_open          (names are [A-Za-z0-9_-]{1,64})
    {type namespace, name "multi_agent_v1",
     tools [{name "spawn_agent"}, ...]}     ->  multi_agent_v1__spawn_agent, ...

A call the model writes to `multi_agent_v1__spawn_agent` goes back as the client named it:
`{name: "spawn_agent", namespace: "multi_agent_v1"}`; one to `github_open` as `github.open`.
Valid plain names are kept as they are, so the same tools give the same prompt as through chat
completions; a flattened name that collides gets a numbered suffix.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from swarm.server.protocol import ApiError

VALID_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
FUNCTION_KEYS = ("name", "description", "parameters", "strict")


@dataclass(slots=True)
class ToolNames:
    function_tools: list[dict] = field(default_factory=list)   # OpenAI function tools, as the model sees them
    ignored: list[str] = field(default_factory=list)            # tool types not offered to the model
    _wire: dict[str, tuple[str | None, str]] = field(default_factory=dict)   # seen -> (namespace, name)
    _seen: dict[tuple[str | None, str], str] = field(default_factory=dict)

    @classmethod
    def of(cls, tools: list[dict]) -> "ToolNames":
        names = cls()
        functions = [(None, tool) for tool in tools if tool.get("type") == "function"]
        for tool in tools:
            if tool.get("type") == "namespace":
                functions += [(tool.get("name"), inner) for inner in _namespace_functions(tool, names.ignored)]
            elif tool.get("type") != "function":
                names.ignored.append(str(tool.get("type")))
        # plain valid names first, so that they keep their names whatever order the tools came in
        functions.sort(key=lambda pair: (pair[0] is not None or not VALID_NAME.match(str(pair[1].get("name"))),
                                         str(pair[0]), str(pair[1].get("name"))))
        for namespace, tool in functions:
            names.function_tools.append(names._function_tool(namespace, tool))
        return names

    def visible(self, namespace: str | None, name: str) -> str:
        """The name the model knows the client's tool by (registered now if no tool declared it)."""
        key = (namespace, name)
        if key not in self._seen:
            seen = _unique(_flat_name(namespace, name), self._wire)
            self._wire[seen] = key
            self._seen[key] = seen
        return self._seen[key]

    def declared(self, namespace: str | None, name: str) -> str | None:
        """The name the model sees for a declared tool, named as the client does or as the model does."""
        offered = {tool["function"]["name"] for tool in self.function_tools}
        seen = self._seen.get((namespace, name), name if namespace is None else None)
        return seen if seen in offered else None

    def wire(self, seen: str) -> tuple[str | None, str]:
        """(namespace, name) as the client knows the tool the model called `seen`."""
        return self._wire.get(seen, (None, seen))

    def _function_tool(self, namespace: str | None, tool: dict) -> dict:
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            where = f"tools (namespace {namespace!r})" if namespace else "tools"
            raise ApiError(400, f"{where}: every function tool needs a name", param="tools")
        function = {key: tool[key] for key in FUNCTION_KEYS if tool.get(key) is not None}
        function["name"] = self.visible(namespace, name)
        return {"type": "function", "function": function}


def _namespace_functions(namespace: dict, ignored: list[str]) -> list[dict]:
    tools = namespace.get("tools") or []
    ignored += [f"{namespace.get('name')}.{t.get('name')} ({t.get('type')})" for t in tools
                if t.get("type") != "function"]
    about = namespace.get("description") or ""
    functions = [t for t in tools if t.get("type") == "function"]
    if not about.strip():
        return functions
    return [{**t, "description": f"{about}\n\n{t.get('description') or ''}".rstrip()} for t in functions]


def _flat_name(namespace: str | None, name: str) -> str:
    flat = f"{namespace}__{name}" if namespace else name
    return re.sub(r"[^A-Za-z0-9_-]", "_", flat)[:64] or "tool"


def _unique(name: str, taken: dict) -> str:
    if name not in taken:
        return name
    number = 2
    while f"{name[:60]}_{number}" in taken:
        number += 1
    return f"{name[:60]}_{number}"


def chat_tool_choice(tool_choice: str | dict | None, names: ToolNames) -> str | dict | None:
    """The Responses tool_choice in chat's shape, naming the tool as the model sees it (forced_call.py)."""
    if tool_choice in (None, "auto", "none", "required"):
        return tool_choice
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and tool_choice.get("name"):
        seen = names.declared(tool_choice.get("namespace"), tool_choice["name"])
        if seen is None:
            raise ApiError(400, f"tool_choice names the function {tool_choice['name']!r}, which is not among "
                                "the tools", param="tool_choice")
        return {"type": "function", "function": {"name": seen}}
    raise ApiError(400, f"tool_choice {json.dumps(tool_choice)} is not supported; use 'auto', 'none', "
                        "'required' or {\"type\": \"function\", \"name\": ...}", param="tool_choice")
