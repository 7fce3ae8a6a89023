"""Everything `swarm inspect-prefix` reports, computed from the spec, the tokenizer and a config.

No weights are loaded: the tokenizer and chat template build the prompts, the model's
config.json (or a shipped one, `--model-config`) gives the bytes per KV token and the weights'
estimated bytes (or a GGUF file's header its own), and with `--card` the KV budget the card leaves
(swarm/trunk/card_budget.py). Without a spec (`--model-config` alone) there are no prompts: the
memory table has the reference trunks only.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from engine import (
    DTYPE_BYTES,
    ModelConfig,
    SpecError,
    WeightMemory,
    estimate_weights,
    gguf_file_weights,
    load_model_config,
    load_tokenizer,
    resolve_model,
    state_bytes_per_sequence,
)
from swarm.spec.harness import load_harness
from swarm.spec.kv_budget import KvBudget
from swarm.spec.model_catalog import load_shipped_or_path
from swarm.spec.schema import AgentSpec, SwarmSpec, load_spec
from swarm.spec.tool_schema import tool_name
from swarm.trunk.canonical import PromptSet, TrunkSource, build_prompts, trunk_source
from swarm.trunk.card_budget import CardBudget, card_budget
from swarm.trunk.lint import Divergence, Finding, find_divergences, lint_trunk
from swarm.trunk.memory_table import REFERENCE_TRUNKS, MemoryTable, memory_table
from swarm.trunk.suffix import Environment, agent_variables
from swarm.trunk.volatile_patterns import Volatiles

JSON_SCHEMA_VERSION = 1
DEFAULT_AGENTS = 8   # without a spec: the seed's swarm
FLOAT_FILE_TYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


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
    """The layers that keep KV: all of them, but in a hybrid (Qwen3.5) its full-attention layers only."""
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    linear_layers: int = 0
    """A hybrid's linear-attention layers: each keeps a state per sequence instead (MemoryTable's state_bytes)."""


@dataclass(frozen=True, slots=True)
class Sizing:
    """What the memory table is sized for (inspect-prefix's options); None takes the spec's own."""

    model_config: str | None = None
    agents: int | None = None
    budget: KvBudget | None = None
    private_tokens: int | None = None
    references: tuple[int, ...] = REFERENCE_TRUNKS
    weights: str | None = None
    """A llama.cpp file type ("q4_k_m") to estimate the weights in."""
    card_bytes: int | None = None
    """The card's memory: the KV budget is what it leaves after the weights and the runtime reserve."""


@dataclass(slots=True)
class SizedWeights:
    memory: WeightMemory
    source: str
    """"estimate" (llama.cpp's tensor types for the file type, on the config's shapes) or "file" (the
    GGUF's own tensors, from its header)."""

    def to_json(self) -> dict:
        return self.memory.to_json() | {"source": self.source}


@dataclass(slots=True)
class PrefixReport:
    """A report on a spec; without one (`--model-config` alone) the spec, trunk and agent fields are
    None or empty and the memory table has the reference trunks only."""

    spec: str | None
    model: str | None
    model_config: str
    harness: str | None
    tools: list[str]
    tools_mode: str | None
    trunk_tokens: int | None
    trunk_sha256: str | None
    system_tokens: int | None
    agents: list[AgentBranch]
    findings: list[Finding]
    kv_shape: KvShape
    memory: MemoryTable
    weights: SizedWeights | None = None
    card: CardBudget | None = None

    @property
    def clean(self) -> bool:
        """No lint findings and no agent leaving the others inside the system message."""
        return not self.findings and not any(agent.in_trunk for agent in self.agents)

    def to_json(self) -> dict:
        """The `--json` document; its schema is documented in the README."""
        trunk = None if self.trunk_tokens is None else {
            "tokens": self.trunk_tokens, "sha256": self.trunk_sha256, "system_tokens": self.system_tokens,
            "tools_mode": self.tools_mode}
        memory = asdict(self.memory) | {"budget_tokens": self.memory.budget_tokens}
        return {"schema_version": JSON_SCHEMA_VERSION, "spec": self.spec, "model": self.model,
                "model_config": self.model_config, "harness": self.harness, "tools": self.tools,
                "trunk": trunk, "agents": [asdict(a) for a in self.agents],
                "findings": [asdict(f) for f in self.findings], "kv_shape": asdict(self.kv_shape),
                "weights": self.weights.to_json() if self.weights else None,
                "card": self.card.to_json(self.memory.bytes_per_token) if self.card else None,
                "memory": memory, "clean": self.clean}


@dataclass(slots=True)
class RenderedSpec:
    """A spec's prompts, rendered with its model's tokenizer, and what lint and divergence found."""

    spec: SwarmSpec
    harness: str
    source: TrunkSource
    prompts: PromptSet
    findings: list[Finding]
    divergences: list[Divergence]


def inspect_prefix(spec_path: str | Path | None, sizing: Sizing = Sizing()) -> PrefixReport:
    assert spec_path is not None or sizing.model_config, "without a spec, --model-config names the model"
    rendered = render_spec(load_spec(spec_path)) if spec_path is not None else None
    spec = rendered.spec if rendered else None
    config = load_shipped_or_path(sizing.model_config) if sizing.model_config else load_model_config(spec.model)
    dtype = _kv_dtype(spec, sizing)
    bytes_per_token = config.kv_bytes_per_token(dtype)
    weights = _weights(spec, config, sizing, dtype) if sizing.weights or sizing.card_bytes else None
    agents = sizing.agents or (len(spec.agents) if spec else DEFAULT_AGENTS)
    card = card_budget(sizing.card_bytes, weights.memory, config, DTYPE_BYTES[dtype], agents) \
        if sizing.card_bytes else None
    trunk_tokens = len(rendered.prompts.trunk.token_ids) if rendered else None
    table = memory_table(bytes_per_token, agents, trunk_tokens, _budget_bytes(spec, sizing, card, bytes_per_token),
                         dtype, sizing.references, sizing.private_tokens, state_bytes(config, dtype))
    return PrefixReport(
        **_spec_fields(rendered, spec_path), model_config=sizing.model_config or spec.model,
        kv_shape=kv_shape(config, dtype), memory=table, weights=weights, card=card)


def _budget_bytes(spec: SwarmSpec | None, sizing: Sizing, card: CardBudget | None, bytes_per_token: int) -> int | None:
    """What the card leaves, else --budget, else the spec's kv_budget; None: no budget."""
    if card is not None:
        return card.budget_bytes
    budget = sizing.budget or (spec.kv_budget if spec else None)
    return budget.to_bytes(bytes_per_token) if budget else None


def render_spec(spec: SwarmSpec) -> RenderedSpec:
    if not spec.model:
        raise SpecError(f"{spec.path}: model: inspect-prefix renders the prompts with the model's tokenizer and "
                        f"chat template; set model: to a local copy of {spec.backend.model!r}")
    if spec.external is not None:
        raise SpecError(f"{spec.path}: harness: {spec.external.name} is an external CLI, whose prompt swarm sees only "
                        "when it sends one: capture its first requests with `swarm serve --capture DIR` and read "
                        "them with `swarm inspect-prefix --requests DIR`")
    tokenizer = load_tokenizer(spec.model)
    harness = load_harness(spec.harness)
    source = trunk_source(harness, spec)
    environments = {agent.name: Environment.detect(_agent_cwd(spec, agent)) for agent in spec.agents}
    prompts = build_prompts(tokenizer, source, spec.agents, environments)
    variables = [agent_variables(agent, environments[agent.name]) for agent in spec.agents]
    findings = lint_trunk(prompts, source, variables, Volatiles.detect(spec.workspace.path, spec.out))
    divergences = find_divergences(tokenizer, prompts, source, variables)
    return RenderedSpec(spec, harness.name, source, prompts, findings, divergences)


def _spec_fields(rendered: RenderedSpec | None, spec_path: str | Path | None) -> dict:
    if rendered is None:
        return dict(spec=None, model=None, harness=None, tools=[], tools_mode=None, trunk_tokens=None,
                    trunk_sha256=None, system_tokens=None, agents=[], findings=[])
    prompts = rendered.prompts
    return dict(spec=str(spec_path), model=rendered.spec.model, harness=rendered.harness,
                tools=[tool_name(s.tool) for s in rendered.source.tools], tools_mode=prompts.trunk.tools_mode,
                trunk_tokens=len(prompts.trunk.token_ids), trunk_sha256=prompts.trunk.sha256,
                system_tokens=len(prompts.agents[0].system_ids),
                agents=_branches(prompts, rendered.divergences), findings=rendered.findings)


def _weights(spec: SwarmSpec | None, config: ModelConfig, sizing: Sizing, dtype: str) -> SizedWeights:
    """--weights estimated on the config; else what the engine would hold: a GGUF file's own tensors
    (its header's bytes), or the spec's weights scheme, or the dtype."""
    file_type = sizing.weights or _engine_file_type(spec, sizing, dtype)
    if file_type is None:
        return SizedWeights(gguf_file_weights(resolve_model(spec.model).path), "file")
    return SizedWeights(estimate_weights(config, file_type), "estimate")


def _engine_file_type(spec: SwarmSpec | None, sizing: Sizing, dtype: str) -> str | None:
    """The file type the engine would keep the weights in; None: a GGUF file's own formats."""
    float_type = FLOAT_FILE_TYPES[dtype]
    if spec is None or sizing.model_config or spec.weights == "float":
        return float_type
    if spec.weights == "auto":
        return None if resolve_model(spec.model).kind == "gguf" else float_type
    return spec.weights   # q8_0 & co: quantized at load


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


def _kv_dtype(spec: SwarmSpec | None, sizing: Sizing) -> str:
    """`auto` sizes for the pool the engine would keep here; a model sized from a shipped config
    (one not installed, usually for a GPU) or for a card is sized in float16."""
    if spec is None:
        return "float16"
    if spec.dtype != "auto":
        return spec.dtype
    if sizing.model_config or sizing.card_bytes or spec.device.startswith("cuda"):
        return "float16"
    from engine import pick_device, pick_kv_dtype
    return str(pick_kv_dtype("auto", pick_device(spec.device))).removeprefix("torch.")


def kv_shape(config: ModelConfig, dtype: str) -> KvShape:
    return KvShape(config.num_kv_layers, config.num_kv_heads, config.head_dim, DTYPE_BYTES[dtype],
                   len(config.linear_layers))


def state_bytes(config: ModelConfig, dtype: str) -> int:
    """A hybrid's linear-attention state per sequence, its conv state in `dtype` (0 for a model with KV only)."""
    return state_bytes_per_sequence(config, DTYPE_BYTES[dtype])
