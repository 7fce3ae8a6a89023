"""The canonical trunk: the static system message every agent of a swarm shares, token for token.

    agent prompt ids = [ trunk ids ............................ ][ suffix ids ............. ]
                         system message: tools + fixed rules       first user message: date,
                         rendered by the model's chat template,    cwd, branch, agent, task,
                         tokenized on its own, shared by all       + generation prompt; private

The trunk text is the chat template's rendering of [system]; the suffix is what rendering
[system, user] adds after it. Each side is tokenized alone and the ids are concatenated, so
a BPE merge across the boundary can never move it. Rules that use per-agent `{{ variables }}`
give each agent its own system message; the trunk is then what all of them still share.

The tools come first in the system message, before its text, even where the template writes
them after it (Qwen2.5's and Qwen3's `{system}\n\n# Tools ...`): a harness's system text often
ends in something volatile (a cwd, a date, its git status), and a tools block of thousands of
tokens after it would then be shared by no two agents. The template renders the tools in its
own words, with a marker for the text, and the text goes in after them (ToolsFirst):

    template:  head + MARKER + gap + tools + tail
    swarm:     head + tools + gap + system text + tail
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import jinja2

from engine import SpecError, SwarmError, Tokenizer
from swarm.spec.harness import Harness
from swarm.spec.schema import AgentSpec, SwarmSpec
from swarm.spec.tool_schema import canonical_json, canonical_tools, tool_name
from swarm.trunk.suffix import Environment, agent_variables, fill, first_user_message
from swarm.trunk.tools_first import MARKER, tools_first_layout

TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


@dataclass(frozen=True, slots=True)
class Segment:
    """One rule or tool of the trunk and where it was written."""

    text: str
    path: Path
    lines: tuple[int, int]
    tool: dict | None = None


@dataclass(slots=True)
class TrunkSource:
    rules: list[Segment]
    tools: list[Segment]

    @property
    def segments(self) -> list[Segment]:
        return self.rules + self.tools


@dataclass(slots=True)
class Trunk:
    text: str
    token_ids: list[int]
    offsets: list[tuple[int, int]]
    tools_mode: str  # "chat-template", "tools-block" or "none"

    @property
    def sha256(self) -> str:
        return token_ids_sha256(self.token_ids)

    def token_at(self, char: int) -> int:
        """Index of the token that holds character `char` of `text`."""
        for index, (_, end) in enumerate(self.offsets):
            if end > char:
                return index
        return max(len(self.offsets) - 1, 0)


@dataclass(slots=True)
class AgentPrompt:
    name: str
    system_text: str
    system_ids: list[int]
    suffix_text: str
    suffix_ids: list[int]

    @property
    def prompt_ids(self) -> list[int]:
        return self.system_ids + self.suffix_ids


@dataclass(slots=True)
class PromptSet:
    trunk: Trunk
    """The tokens every agent's prompt starts with."""
    written: Trunk
    """The system message as written, `{{ variables }}` unfilled: what prefix lint scans."""
    agents: list[AgentPrompt]


def token_ids_sha256(ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def trunk_source(harness: Harness, spec: SwarmSpec) -> TrunkSource:
    """The harness's rules and tools plus the spec's extra ones, tools in canonical order."""
    rules = [Segment(rule, harness.path, (line, line)) for rule, line in zip(harness.rules, harness.rule_lines)]
    rules += [Segment(rule, spec.path, spec.lines[f"extra_rules[{i}]"]) for i, rule in enumerate(spec.extra_rules)]
    origins = {name: (harness.path, (line, line)) for name, line in harness.tool_lines.items()}
    for i, tool in enumerate(spec.extra_tools):
        if tool_name(tool) in origins:
            start = spec.lines[f"extra_tools[{i}]"][0]
            raise SpecError(f"{spec.path}:{start}: extra_tools[{i}]: the harness already has a tool "
                            f"named {tool_name(tool)!r}; rename it or drop it")
        origins[tool_name(tool)] = (spec.path, spec.lines[f"extra_tools[{i}]"])
    tools = canonical_tools(harness.tools + spec.extra_tools)
    if not spec.run_command.enabled:
        tools = [t for t in tools if tool_name(t) != "run_command"]
    return TrunkSource(rules, [Segment(canonical_json(t), *origins[tool_name(t)], tool=t) for t in tools])


def build_prompts(tokenizer: Tokenizer, source: TrunkSource, agents: list[AgentSpec],
                  environments: dict[str, Environment]) -> PromptSet:
    assert agents, "a swarm has at least one agent"
    tools = [segment.tool for segment in source.tools]
    mode = tools_mode(tokenizer, tools)
    rules = [segment.text for segment in source.rules]
    written = _tokenized_trunk(tokenizer, _render(tokenizer, _content(rules, tools, mode), tools, mode), mode)
    prompts = [_agent_prompt(tokenizer, rules, tools, mode, agent, environments[agent.name]) for agent in agents]
    return PromptSet(trunk=_shared(tokenizer, prompts, mode), written=written, agents=prompts)


def tools_block(tools: list[dict]) -> str:
    return TOOLS_BLOCK.format(tools="\n".join(canonical_json(tool) for tool in tools))


def _agent_prompt(tokenizer: Tokenizer, rules: list[str], tools: list[dict], mode: str,
                  agent: AgentSpec, env: Environment) -> AgentPrompt:
    content = system_content(agent_rules_text(rules, agent, env), tools, mode)
    system_text = _render(tokenizer, content, tools, mode)
    full_text = _render(tokenizer, content, tools, mode, user=first_user_message(agent, env))
    if not full_text.startswith(system_text):
        raise SwarmError("the model's chat template renders the system message differently once a user "
                         "message follows, so no trunk can be shared; use a model with a stable template")
    suffix_text = full_text[len(system_text):]
    system_ids, _ = tokenize_with_offsets(tokenizer, system_text, first=True)
    suffix_ids, _ = tokenize_with_offsets(tokenizer, suffix_text, first=False)
    return AgentPrompt(agent.name, system_text, system_ids, suffix_text, suffix_ids)


def _shared(tokenizer: Tokenizer, prompts: list[AgentPrompt], mode: str) -> Trunk:
    first = prompts[0]
    ids, offsets = tokenize_with_offsets(tokenizer, first.system_text, first=True)
    length = common_prefix_length([p.system_ids for p in prompts])
    if length == len(ids):
        return Trunk(first.system_text, ids, offsets, mode)
    end = offsets[length - 1][1] if length else 0
    return Trunk(first.system_text[:end], ids[:length], offsets[:length], mode)


def common_prefix_length(sequences: list[list[int]]) -> int:
    """How many tokens every one of `sequences` starts with."""
    shortest = min(len(s) for s in sequences)
    for index in range(shortest):
        if len({s[index] for s in sequences}) > 1:
            return index
    return shortest


def _tokenized_trunk(tokenizer: Tokenizer, text: str, mode: str) -> Trunk:
    ids, offsets = tokenize_with_offsets(tokenizer, text, first=True)
    return Trunk(text, ids, offsets, mode)


def tokenize_with_offsets(tokenizer: Tokenizer, text: str,
                          first: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and character spans; a BOS token is added only at the very start, and only once."""
    ids, offsets = tokenizer.encode_with_offsets(text)
    bos = tokenizer.bos_token_id
    if first and tokenizer.add_bos_token and bos is not None and ids[:1] != [bos]:
        return [bos] + ids, [(0, 0)] + offsets
    return ids, offsets


def _content(rules: list[str], tools: list[dict], mode: str) -> str:
    return system_content(rules_text(rules), tools, mode)


def rules_text(rules: list[str]) -> str:
    """The rules as the system message states them: each stripped, a blank line apart."""
    return "\n\n".join(rule.strip() for rule in rules)


def agent_rules_text(rules: list[str], agent: AgentSpec, env: Environment) -> str:
    """One agent's rules text, its {{ variables }} filled in. Local trunks and the system message
    sent to a remote server both come from here, so they stay byte-identical."""
    return rules_text([fill(rule, agent_variables(agent, env)) for rule in rules])


def system_content(text: str, tools: list[dict], mode: str) -> str:
    """The system message's content: the Hermes tools block, then `text`, where the chat
    template does not render the tools itself (mode "tools-block"); else `text`."""
    if mode != "tools-block":
        return text
    return f"{tools_block(tools)}\n\n{text}" if text else tools_block(tools)


def _render(tokenizer: Tokenizer, content: str, tools: list[dict], mode: str, user: str | None = None) -> str:
    messages = [{"role": "system", "content": content}]
    if user is not None:
        messages.append({"role": "user", "content": user})
    layout = tools_first_layout(tokenizer, tools) if mode == "chat-template" else None
    if layout is not None:
        messages[0]["content"] = MARKER
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools if layout else None,
                                             add_generation_prompt=user is not None)
    except jinja2.TemplateError as err:
        raise SwarmError(f"the model's chat template cannot render the prompt: {err}") from None
    return layout.place(text, content) if layout else text


def tools_mode(tokenizer: Tokenizer, tools: list[dict]) -> str:
    """Native tool rendering where the template writes every tool into the system message in a
    way they can go before its text (swarm/trunk/tools_first.py); else a Hermes tools block."""
    if not tools:
        return "none"
    if not tokenizer.supports_tools or tools_first_layout(tokenizer, tools) is None:
        return "tools-block"
    return "chat-template"
