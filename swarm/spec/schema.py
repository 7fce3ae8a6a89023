"""swarm.yaml: what to run, checked up front so a mistake is one line naming file, line and key.

Every key is documented in the README's swarm.yaml reference; `swarm.yaml.example` shows them all.
Relative paths (model, harness, workspace, out) are relative to the spec file's folder.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from yaml.nodes import MappingNode, Node, SequenceNode

from engine import NAMED_MODELS, WEIGHT_SCHEMES, ModelLoadError, resolve_model
from swarm.spec.backend import ENGINE_ONLY_KEYS, BackendSpec, read_backend
from swarm.spec.external_harness import ExternalHarness, is_external_file, load_external_harness, read_external_harness
from swarm.spec.harness import load_harness, resolve_harness
from swarm.spec.kv_budget import KvBudget, parse_kv_budget
from swarm.spec.reader import SpecReader, describe, end_line_of, line_of
from swarm.spec.tool_schema import normalize_tool, tool_name

WORKSPACE_MODES = ("copy", "shared-readonly")   # copy: a copy per agent; shared-readonly: one, unwritable

TOP_KEYS = ["model", "backend", "device", "dtype", "weights", "kv_budget", "graphs", "canonicalize", "harness",
            "extra_tools", "extra_rules", "agents", "task", "workspace", "sampling", "limits", "run_command", "out"]
DTYPES = ["auto", "float16", "bfloat16", "float32"]
DEFAULT_HARNESS = "coding-agent"
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(slots=True)
class AgentSpec:
    name: str
    task: str
    context: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class WorkspaceSpec:
    path: Path
    mode: str = "copy"


@dataclass(slots=True)
class SamplingSpec:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 1024


@dataclass(slots=True)
class LimitsSpec:
    max_turns: int = 30
    max_tokens: int = 32768
    wall_time: float = 1800.0


@dataclass(slots=True)
class RunCommandSpec:
    enabled: bool = False
    timeout: float = 60.0


@dataclass(slots=True)
class SwarmSpec:
    path: Path
    model: str
    """The local model; with a remote backend only `swarm inspect-prefix` reads it ("" when not given)."""
    agents: list[AgentSpec]
    backend: BackendSpec = field(default_factory=BackendSpec)
    ignored_keys: list[str] = field(default_factory=list)
    """Keys the backend has no use for (the engine's own with a remote server), to note at the start."""
    device: str = "auto"
    dtype: str = "auto"
    weights: str = "auto"
    """How the model's weights are kept: auto (a GGUF's own formats), float, or q8_0 & co (quantized at load)."""
    kv_budget: KvBudget | None = None
    graphs: bool = True
    """A GPU's decode steps replayed as CUDA/HIP graphs (engine.decode_graphs); false: eager."""
    canonicalize: bool = False
    """`swarm serve SPEC`: move the volatile parts of clients' system texts to their first user message."""
    harness: Path | None = None
    """The built-in harness file (rules and tools for swarm's own agent loop); None with an external one."""
    external: ExternalHarness | None = None
    """The CLI swarm launches as each agent (`harness: claude-code`, or an inline block); None when built in."""
    extra_tools: list[dict] = field(default_factory=list)
    extra_rules: list[str] = field(default_factory=list)
    task: str | None = None
    workspace: WorkspaceSpec | None = None
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    limits: LimitsSpec = field(default_factory=LimitsSpec)
    run_command: RunCommandSpec = field(default_factory=RunCommandSpec)
    out: Path | None = None
    lines: dict[str, tuple[int, int]] = field(default_factory=dict)
    """First and last line of each located value: "extra_rules[0]", "extra_tools[1]", "model"."""


# name: (type, minimum, maximum); None as a type allows `null`
_SAMPLING = {"temperature": (float, 0.0, 2.0), "top_p": (float, 0.0, 1.0), "top_k": (int, 0, None),
             "seed": ((int, type(None)), None, None), "max_tokens": (int, 1, None)}
_LIMITS = {"max_turns": (int, 1, None), "max_tokens": (int, 1, None), "wall_time": (float, 1.0, None)}
_RUN_COMMAND = {"enabled": (bool, None, None), "timeout": (float, 0.1, None)}


def load_spec(path: str | Path, check_model: bool = True) -> SwarmSpec:
    """Read and validate a swarm.yaml; raise SpecError (exit code 2) with one line on any mistake."""
    reader = SpecReader(path)
    root_node = reader.load()
    root = reader.mapping(root_node, "", TOP_KEYS, required=["agents"])
    base = Path(path).resolve().parent
    backend = read_backend(reader, root["backend"]) if "backend" in root else BackendSpec()
    if "model" not in root and not backend.is_remote:
        raise reader.fail(root_node, "model", "missing required key")
    model = _model(reader, root["model"], base, check_model and not backend.is_remote) if "model" in root else ""
    spec = SwarmSpec(path=Path(path), model=model, agents=[], backend=backend)
    spec.lines = {key: (line_of(node), end_line_of(node)) for key, node in root.items()}
    if backend.is_remote:
        spec.ignored_keys = [key for key in ENGINE_ONLY_KEYS if key in root]
    spec.task = _task(reader, root.get("task"), "task")
    spec.agents = _agents(reader, root["agents"], spec.task)
    _read_engine_keys(reader, root, spec)
    spec.harness, spec.external = _harness(reader, root.get("harness"), root_node, base)
    _refuse_additions(reader, root, spec.external)
    harness_tools = [tool_name(tool) for tool in load_harness(spec.harness).tools] if spec.harness else []
    spec.extra_rules = _rules(reader, root.get("extra_rules"), spec)
    spec.extra_tools = _tools(reader, root.get("extra_tools"), spec, harness_tools)
    spec.workspace = _workspace(reader, root.get("workspace"), base)
    spec.sampling = _section(reader, root.get("sampling"), "sampling", SamplingSpec, _SAMPLING)
    spec.limits = _section(reader, root.get("limits"), "limits", LimitsSpec, _LIMITS)
    spec.run_command = _section(reader, root.get("run_command"), "run_command", RunCommandSpec, _RUN_COMMAND)
    _check_commands(reader, root.get("workspace"), spec, harness_tools)
    spec.out = _out(reader, root.get("out"), root_node, base)
    return spec


def _model(reader: SpecReader, node: Node, base: Path, check: bool) -> str:
    ref = reader.typed(node, "model", str)
    if ref not in NAMED_MODELS and _path(base, ref).exists():
        ref = str(_path(base, ref))
    if check:
        try:
            resolve_model(ref)
        except ModelLoadError as err:
            raise reader.fail(node, "model", str(err)) from None
    return ref


def _read_engine_keys(reader: SpecReader, root: dict[str, Node], spec: SwarmSpec) -> None:
    if "device" in root:
        spec.device = reader.typed(root["device"], "device", str)
        if not _DEVICE.match(spec.device):
            raise reader.fail(root["device"], "device", f"{spec.device!r} is not auto, cpu, cuda or cuda:N")
    if "dtype" in root:
        spec.dtype = reader.choice(root["dtype"], "dtype", DTYPES)
    if "weights" in root:
        spec.weights = _weights(reader, root["weights"], spec.model)
    if "kv_budget" in root:
        spec.kv_budget = _kv_budget(reader, root["kv_budget"])
    if "graphs" in root:
        spec.graphs = reader.typed(root["graphs"], "graphs", bool)
    if "canonicalize" in root:
        spec.canonicalize = reader.typed(root["canonicalize"], "canonicalize", bool)


def _weights(reader: SpecReader, node: Node, model: str) -> str:
    scheme = reader.choice(node, "weights", WEIGHT_SCHEMES)
    if scheme not in ("auto", "float") and model and resolve_model(model).kind == "gguf":
        raise reader.fail(node, "weights", f"{scheme} quantizes a Hugging Face checkpoint at load; {model} is a "
                          "GGUF file, which keeps its own formats (use auto)")
    return scheme


def _kv_budget(reader: SpecReader, node: Node) -> KvBudget | None:
    raw = reader.typed(node, "kv_budget", (int, str))
    if raw == "auto":
        return None
    try:
        return parse_kv_budget(raw)
    except ValueError as err:
        raise reader.fail(node, "kv_budget", str(err)) from None


def _task(reader: SpecReader, node: Node | None, key: str) -> str | None:
    if node is None:
        return None
    task = reader.typed(node, key, str).strip()
    if not task:
        raise reader.fail(node, key, "is empty; say what the agent should do")
    return task


def _agents(reader: SpecReader, node: Node, default_task: str | None) -> list[AgentSpec]:
    if not isinstance(node, SequenceNode):
        count = _agent_count(reader, node)
        if default_task is None:
            raise reader.fail(node, "task", "missing required key: agents is a count, so set a top-level task")
        return [AgentSpec(name=f"agent-{i + 1}", task=default_task) for i in range(count)]
    items = reader.sequence(node, "agents")
    if not items:
        raise reader.fail(node, "agents", "the list is empty; give at least one agent")
    agents = [_agent(reader, item, f"agents[{i}]", i, default_task) for i, item in enumerate(items)]
    seen: set[str] = set()
    for item, agent in zip(items, agents):
        if agent.name in seen:
            raise reader.fail(item, "agents", f"two agents are named {agent.name!r}; names must differ")
        seen.add(agent.name)
    return agents


def _agent_count(reader: SpecReader, node: Node) -> int:
    value = reader.value(node, "agents")
    if isinstance(value, bool) or not isinstance(value, int):
        raise reader.fail(node, "agents", f"expected a count like 4 or a list of agents, got {describe(node)}")
    return reader.number(node, "agents", int, minimum=1, maximum=256)


def _agent(reader: SpecReader, node: Node, key: str, index: int, default_task: str | None) -> AgentSpec:
    values = reader.mapping(node, key, ["name", "task", "context"])
    name = reader.typed(values["name"], f"{key}.name", str) if "name" in values else f"agent-{index + 1}"
    if not _AGENT_NAME.match(name):
        raise reader.fail(values.get("name", node), f"{key}.name",
                          f"{name!r} must be letters, digits, '.', '_' or '-' (it names a folder)")
    task = _task(reader, values.get("task"), f"{key}.task") or default_task
    if task is None:
        raise reader.fail(node, f"{key}.task", "missing required key (or set a top-level task)")
    return AgentSpec(name=name, task=task, context=_context(reader, values.get("context"), f"{key}.context"))


def _context(reader: SpecReader, node: Node | None, key: str) -> dict[str, str]:
    if node is None:
        return {}
    raw = reader.typed(node, key, dict)
    context = {}
    for name, value in raw.items():
        if not isinstance(name, str) or isinstance(value, (dict, list)):
            raise reader.fail(node, f"{key}.{name}", "context variables are name: text pairs")
        context[name] = "" if value is None else str(value)
    return context


def _harness(reader: SpecReader, node: Node | None, root: Node,
             base: Path) -> tuple[Path | None, ExternalHarness | None]:
    """(built-in harness file, None) or (None, external harness): a name, a path or an inline block."""
    if isinstance(node, MappingNode):
        return None, read_external_harness(reader, node, "harness", base)
    ref = DEFAULT_HARNESS if node is None else reader.typed(node, "harness", str)
    try:
        path = resolve_harness(ref, base)
    except ValueError as err:
        raise reader.fail(node or root, "harness", str(err)) from None
    return (None, load_external_harness(path)) if is_external_file(path) else (path, None)


def _refuse_additions(reader: SpecReader, root: dict[str, Node], external: ExternalHarness | None) -> None:
    """A CLI brings its own prompt and tools; swarm has no way to add rules or tools to them."""
    for key in ("extra_rules", "extra_tools"):
        if external is not None and key in root:
            raise reader.fail(root[key], key, f"the external harness {external.name} keeps its own prompt and "
                                              f"tools, so swarm cannot add {key.removeprefix('extra_')} to it; "
                                              "drop the key or use a built-in harness")


def _rules(reader: SpecReader, node: Node | None, spec: SwarmSpec) -> list[str]:
    if node is None:
        return []
    rules = []
    for i, item in enumerate(reader.sequence(node, "extra_rules")):
        rules.append(reader.typed(item, f"extra_rules[{i}]", str))
        spec.lines[f"extra_rules[{i}]"] = (line_of(item), end_line_of(item))
    return rules


def _tools(reader: SpecReader, node: Node | None, spec: SwarmSpec, harness_tools: list[str]) -> list[dict]:
    if node is None:
        return []
    tools, given = [], {}
    for i, item in enumerate(reader.sequence(node, "extra_tools")):
        key = f"extra_tools[{i}]"
        try:
            tool = normalize_tool(reader.typed(item, key, dict))
        except ValueError as err:
            raise reader.fail(item, key, str(err)) from None
        name = tool_name(tool)
        if name in harness_tools:
            raise reader.fail(item, key, f"the harness already has a tool named {name!r}; rename it or drop it")
        if name in given:
            raise reader.fail(item, key, f"{given[name]} is already named {name!r}; tool names must differ")
        given[name] = key
        tools.append(tool)
        spec.lines[key] = (line_of(item), end_line_of(item))
    return tools


def _check_commands(reader: SpecReader, workspace: Node | None, spec: SwarmSpec, harness_tools: list[str]) -> None:
    """The trunk keeps run_command only when run_command.enabled; a command could change a shared tree."""
    tools = harness_tools + [tool_name(tool) for tool in spec.extra_tools]
    if spec.workspace.mode != "shared-readonly" or "run_command" not in tools or not spec.run_command.enabled:
        return
    mode = reader.mapping(workspace, "workspace", ["path", "mode"])["mode"]
    raise reader.fail(mode, "workspace.mode", "shared-readonly cannot go with the run_command tool (a command "
                                              "could change the shared tree); set run_command.enabled: false "
                                              "or workspace.mode: copy")


def _workspace(reader: SpecReader, node: Node | None, base: Path) -> WorkspaceSpec:
    if node is None:
        return WorkspaceSpec(path=base)
    if not isinstance(node, MappingNode):
        return WorkspaceSpec(path=_folder(reader, node, "workspace", base))
    values = reader.mapping(node, "workspace", ["path", "mode"], required=["path"])
    path = _folder(reader, values["path"], "workspace.path", base)
    mode = reader.choice(values["mode"], "workspace.mode", WORKSPACE_MODES) if "mode" in values else "copy"
    return WorkspaceSpec(path=path, mode=mode)


def _folder(reader: SpecReader, node: Node, key: str, base: Path) -> Path:
    path = _path(base, reader.typed(node, key, str))
    if not path.exists():
        raise reader.fail(node, key, f"no folder {path}; point it at the project the agents work on")
    if not path.is_dir():
        raise reader.fail(node, key, f"{path} is a file, not a folder; point it at the project the agents work on")
    return path


def _out(reader: SpecReader, node: Node | None, root: Node, base: Path) -> Path:
    path = _path(base, "runs" if node is None else reader.typed(node, "out", str))
    blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise reader.fail(node or root, "out", f"{blocking} is a file, not a folder; name a folder for the run output")
    return path


def _section(reader: SpecReader, node: Node | None, key: str, cls: type, schema: dict):
    if node is None:
        return cls()
    assert [f.name for f in fields(cls)] == list(schema), f"{cls.__name__} and its schema disagree"
    values = reader.mapping(node, key, schema)
    kwargs = {}
    for name, value_node in values.items():
        kind, minimum, maximum = schema[name]
        path = f"{key}.{name}"
        value = reader.typed(value_node, path, kind)
        if value is not None and (minimum is not None or maximum is not None):
            value = reader.number(value_node, path, kind, minimum, maximum)
        kwargs[name] = value
    return cls(**kwargs)


def _path(base: Path, raw: str) -> Path:
    return base / Path(raw).expanduser()
