"""Does the spec's kv_budget hold its trunk? Answered from the tokenizer and config.json, as
`swarm inspect-prefix` does, before any weights load and before a run folder exists, so a budget
too small is a spec error (exit 2) instead of a run that fails after loading the model.
"""
from __future__ import annotations

import warnings
from datetime import datetime
from pathlib import Path

from engine import EngineOptions, SpecError, load_model_config, load_tokenizer, pick_device, pick_dtype
from swarm.spec.harness import load_harness
from swarm.spec.kv_budget import min_pool_tokens
from swarm.spec.schema import SwarmSpec
from swarm.trunk.canonical import PromptSet, build_prompts, trunk_source
from swarm.trunk.suffix import Environment


def check_trunk_fits(spec: SwarmSpec, out: Path) -> None:
    """SpecError naming the kv_budget line and the least budget that holds the trunk and one agent."""
    budget = spec.kv_budget
    if budget is None or spec.backend.is_remote:
        return
    prompts = stand_in_prompts(spec, out)
    bytes_per_token = load_model_config(spec.model).kv_bytes_per_token(engine_dtype(spec))
    block_size = EngineOptions().block_size
    trunk = len(prompts.trunk.token_ids)
    longest = max(len(agent.prompt_ids) for agent in prompts.agents)
    need = min_pool_tokens(trunk, longest, block_size)
    have = budget.pool_tokens(bytes_per_token, block_size)
    if have >= need:
        return
    least = f"{need:,} tokens" + ("" if budget.tokens is not None else f" ({budget.in_my_unit(need, bytes_per_token)})")
    raise SpecError(f"{spec.path}:{spec.lines['kv_budget'][0]}: kv_budget: {budget} holds {have:,} tokens of KV, "
                    f"too few for the trunk ({trunk:,} tokens) and an agent's prompt after it "
                    f"({longest:,} tokens in all); give at least {least}")


def stand_in_prompts(spec: SwarmSpec, out: Path) -> PromptSet:
    """The prompts a run will build; the run's workspace copies do not exist yet, so paths of the
    same shape stand in for them, named for this second as the run's folder will be (a tokenizer
    merges runs of zeros, so a dummy timestamp could be tokens shorter than the real one)."""
    run_dir = out / f"{spec.path.stem.removesuffix('.yaml')}-{datetime.now():%Y%m%d-%H%M%S}"
    environments = {agent.name: Environment.detect(_agent_cwd(spec, run_dir, agent.name)) for agent in spec.agents}
    source = trunk_source(load_harness(spec.harness), spec)
    return build_prompts(load_tokenizer(spec.model), source, spec.agents, environments)


def engine_dtype(spec: SwarmSpec) -> str:
    """The KV dtype the engine will pick; its warnings come when the engine picks it for real."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dtype = pick_dtype(spec.dtype, pick_device(spec.device))
    return str(dtype).removeprefix("torch.")


def _agent_cwd(spec: SwarmSpec, run_dir: Path, agent: str) -> Path:
    if spec.workspace.mode == "shared-readonly":
        return spec.workspace.path
    return run_dir / "workspaces" / agent
