"""Everything `swarm inspect-prefix` reports, computed from the spec, the tokenizer and a config.

No weights are loaded: the tokenizer and chat template build the prompts, the model's
config.json (or a shipped one, `--model-config`) gives the bytes per KV token.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from engine import DTYPE_BYTES, ModelConfig, SpecError, load_model_config, load_tokenizer
from swarm.spec.harness import load_harness
from swarm.spec.kv_budget import KvBudget
from swarm.spec.model_catalog import load_shipped_or_path
from swarm.spec.schema import AgentSpec, SwarmSpec, load_spec
from swarm.spec.tool_schema import tool_name
from swarm.trunk.canonical import PromptSet, build_prompts, trunk_source
from swarm.trunk.lint import Divergence, Finding, find_divergences, lint_trunk
from swarm.trunk.memory_table import REFERENCE_TRUNKS, MemoryTable, memory_table
from swarm.trunk.suffix import Environment, agent_variables
from swarm.trunk.volatile_patterns import Volatiles

JSON_SCHEMA_VERSION = 1


@dataclass(slots=True)
class AgentBranch:
    name: str
    prompt_tokens: int
    suffix_tokens: int
    diverges_at: int | None
    diverges_from: str | None
    in_trunk: bool
    reason: str


@dataclass(slots=True)
class KvShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int


@dataclass(slots=True)
class PrefixReport:
    spec: str
    model: str
    model_config: str
    harness: str
    tools: list[str]
    tools_mode: str
    trunk_tokens: int
    trunk_sha256: str
    system_tokens: int
    agents: list[AgentBranch]
    findings: list[Finding]
    kv_shape: KvShape
    memory: MemoryTable

    @property
    def clean(self) -> bool:
        """No lint findings and no agent leaving the others inside the system message."""
        return not self.findings and not any(agent.in_trunk for agent in self.agents)

    def to_json(self) -> dict:
        """The `--json` document; its schema is documented in the README."""
        trunk = {"tokens": self.trunk_tokens, "sha256": self.trunk_sha256, "system_tokens": self.system_tokens,
                 "tools_mode": self.tools_mode}
        memory = asdict(self.memory) | {"budget_tokens": self.memory.budget_tokens}
        return {"schema_version": JSON_SCHEMA_VERSION, "spec": self.spec, "model": self.model,
                "model_config": self.model_config, "harness": self.harness, "tools": self.tools,
                "trunk": trunk, "agents": [asdict(a) for a in self.agents],
                "findings": [asdict(f) for f in self.findings], "kv_shape": asdict(self.kv_shape),
                "memory": memory, "clean": self.clean}


def inspect_prefix(spec_path: str | Path, model_config: str | None = None, agents: int | None = None,
                   budget: KvBudget | None = None, private_tokens: int | None = None,
                   references: tuple[int, ...] = REFERENCE_TRUNKS) -> PrefixReport:
    spec = load_spec(spec_path)
    if not spec.model:
        raise SpecError(f"{spec_path}: model: inspect-prefix renders the prompts with the model's tokenizer and "
                        f"chat template; set model: to a local copy of {spec.backend.model!r}")
    tokenizer = load_tokenizer(spec.model)
    harness = load_harness(spec.harness)
    source = trunk_source(harness, spec)
    environments = {agent.name: Environment.detect(_agent_cwd(spec, agent)) for agent in spec.agents}
    prompts = build_prompts(tokenizer, source, spec.agents, environments)
    variables = [agent_variables(agent, environments[agent.name]) for agent in spec.agents]
    findings = lint_trunk(prompts, source, variables, Volatiles.detect(spec.workspace.path, spec.out))
    divergences = find_divergences(tokenizer, prompts, source, variables)
    config = load_shipped_or_path(model_config) if model_config else load_model_config(spec.model)
    dtype = _kv_dtype(spec, model_config)
    bytes_per_token = config.kv_bytes_per_token(dtype)
    budget = budget or spec.kv_budget
    table = memory_table(bytes_per_token, agents or len(spec.agents), len(prompts.trunk.token_ids),
                         budget.to_bytes(bytes_per_token) if budget else None, dtype,
                         references, private_tokens)
    return PrefixReport(
        spec=str(spec_path), model=spec.model, model_config=model_config or spec.model,
        harness=harness.name, tools=[tool_name(s.tool) for s in source.tools],
        tools_mode=prompts.trunk.tools_mode, trunk_tokens=len(prompts.trunk.token_ids),
        trunk_sha256=prompts.trunk.sha256, system_tokens=len(prompts.agents[0].system_ids),
        agents=_branches(prompts, divergences), findings=findings,
        kv_shape=_kv_shape(config, dtype), memory=table)


def _agent_cwd(spec: SwarmSpec, agent: AgentSpec) -> Path:
    """Shared-readonly agents work in the workspace itself; copying agents in their own copy
    (a stand-in path: a run puts it under its own run folder)."""
    if spec.workspace.mode == "shared-readonly":
        return spec.workspace.path
    return spec.out / "workspaces" / agent.name


def _branches(prompts: PromptSet, divergences: list[Divergence]) -> list[AgentBranch]:
    by_agent = {d.agent: d for d in divergences}
    branches = []
    for prompt in prompts.agents:
        d = by_agent.get(prompt.name)
        branches.append(AgentBranch(
            name=prompt.name, prompt_tokens=len(prompt.prompt_ids), suffix_tokens=len(prompt.suffix_ids),
            diverges_at=d.token_index if d else None, diverges_from=d.other if d else None,
            in_trunk=d.in_trunk if d else False, reason=d.reason if d else "the only agent"))
    return branches


def _kv_dtype(spec, model_config) -> str:
    """`auto` sizes for what the engine would pick here; a model sized from a shipped config
    (one not installed, usually for a GPU) is sized in float16."""
    if spec.dtype != "auto":
        return spec.dtype
    if model_config or spec.device.startswith("cuda"):
        return "float16"
    from engine import pick_device, pick_dtype
    return str(pick_dtype("auto", pick_device(spec.device))).removeprefix("torch.")


def _kv_shape(config: ModelConfig, dtype: str) -> KvShape:
    return KvShape(config.num_layers, config.num_kv_heads, config.head_dim, DTYPE_BYTES[dtype])
