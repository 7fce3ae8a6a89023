"""Shared by the spec, trunk, lint and inspect tests: spec files on disk and the default tokenizer."""
from __future__ import annotations

import re
import textwrap
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest

from engine.errors import SpecError
from engine.loading.loader import load_tokenizer
from engine.loading.named_models import DEFAULT_MODEL
from engine.loading.tokenizer import Tokenizer
from swarm.spec.harness import load_harness
from swarm.spec.schema import SwarmSpec, load_spec
from swarm.trunk.canonical import PromptSet, TrunkSource, build_prompts, trunk_source
from swarm.trunk.suffix import Environment, agent_variables

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SPEC = REPO / "swarm.yaml.example"
ONE_LINE = re.compile(r"^(?P<file>\S+):(?P<line>\d+): (?P<key>[^:]+): .+$")   # a spec error's form

MINIMAL = f"""\
model: {DEFAULT_MODEL}
task: fix the failing test
agents: 3
"""


def write_spec(folder: Path, text: str, name: str = "swarm.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


@lru_cache(maxsize=1)
def default_tokenizer() -> Tokenizer:
    return load_tokenizer(DEFAULT_MODEL)


def with_template(template: str) -> Tokenizer:
    """The default tokenizer with another chat template (the vocabulary stays the same)."""
    base = default_tokenizer()
    return Tokenizer(base.backend, template, bos_token=base.bos_token, eos_token=base.eos_token,
                     add_bos_token=base.add_bos_token, eos_token_ids=base.eos_token_ids)


FIXED_ENV = Environment(date="2025-06-01 14:03 UTC", platform="Linux x86_64", git_branch="main", cwd="/w")


def prompts_for(spec: SwarmSpec, tokenizer: Tokenizer | None = None,
                env: Environment = FIXED_ENV) -> tuple[PromptSet, TrunkSource, list[dict]]:
    source = trunk_source(load_harness(spec.harness), spec)
    environments = {a.name: replace(env, cwd=f"{env.cwd}/{a.name}") for a in spec.agents}
    prompts = build_prompts(tokenizer or default_tokenizer(), source, spec.agents, environments)
    variables = [agent_variables(a, environments[a.name]) for a in spec.agents]
    return prompts, source, variables


def load(folder: Path, text: str) -> SwarmSpec:
    return load_spec(write_spec(folder, text))


def alias_bomb_tool(levels: int = 9, width: int = 9, key: str = "extra_tools") -> str:
    """`extra_tools:` (or another `key`) holding one tool whose parameters are a "billion laughs" YAML alias bomb:
    each anchor lists the previous one `width` times, so 9 short lines stand for 9^9 values."""
    lines = [f"{key}:", "  - name: laughs", "    parameters:", "      type: object", "      properties:",
             f"        l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"        l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def spec_error(tmp_path, text: str) -> tuple[str, int, str, str]:
    """Load `text` as a spec that must fail: (message, line, key, what to fix), its form checked."""
    path = write_spec(tmp_path, text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    message = str(caught.value)
    assert "\n" not in message
    assert caught.value.exit_code == 2
    match = ONE_LINE.match(message)
    assert match, message
    assert match["file"] == str(path)
    return message, int(match["line"]), match["key"], message.split(": ", 2)[2]
