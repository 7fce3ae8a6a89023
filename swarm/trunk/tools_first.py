"""The tools before the system text, in the chat template's own words.

Qwen2.5's and Qwen3's templates write the system turn as `{system}\\n\\n# Tools ... </tools> ...`: the
tools after the text. A harness's text often ends in something volatile (its cwd, the date, git
status), and every token after the first difference is private, so swarm puts the tools first.
The template renders the system turn once with the tools and a marker as the text, and once
without tools; what the first has more, after the marker, is the tools block:

    with tools:     head + MARKER + gap + tools + tail      e.g. "<|im_start|>system\\n" MARKER
    without tools:  head + MARKER + tail                         "\\n\\n" "# Tools ..." "<|im_end|>\\n"
    swarm:          head + tools + gap + system text + tail

A template that words the system turn otherwise (tools in the user turn, as Llama 3.1's; tools
before the marker; a head that changes) has no layout: swarm writes its Hermes tools block instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import jinja2

from engine import ModelLoadError, Tokenizer
from swarm.spec.tool_schema import tool_name

MARKER = "\u27e6swarm:system-text\u27e7"
"""Stands for the system text while the template renders; no harness writes it."""
_BLANK_LINE = "\n\n"


@dataclass(frozen=True, slots=True)
class ToolsFirst:
    tools: str
    """The tools as the template words them, from its heading to its last instruction."""
    gap: str
    """What the template writes between the system text and the tools ("\\n\\n" in Qwen's)."""

    def place(self, rendered: str, text: str) -> str:
        """`rendered` (the template's output with MARKER as the system text) with the tools first."""
        template_order = MARKER + self.gap + self.tools
        tools_first = f"{self.tools}{self.gap or _BLANK_LINE}{text}" if text else self.tools
        if template_order in rendered:
            return rendered.replace(template_order, tools_first, 1)
        return rendered.replace(MARKER, text, 1)


def tools_first_layout(tokenizer: Tokenizer, tools: list[dict]) -> ToolsFirst | None:
    """Where the template writes `tools` in the system turn; None where it cannot be found."""
    with_tools = _system_turn(tokenizer, tools)
    without = _system_turn(tokenizer, None)
    if with_tools is None or without is None or MARKER not in with_tools or MARKER not in without:
        return None
    head, _, after = with_tools.partition(MARKER)
    plain_head, _, plain_tail = without.partition(MARKER)
    if head != plain_head or not after.endswith(plain_tail) or len(after) == len(plain_tail):
        return None
    block = after[:len(after) - len(plain_tail)]
    words = block.lstrip()
    if not all(f'"{tool_name(tool)}"' in words for tool in tools):
        return None
    return ToolsFirst(words, block[:len(block) - len(words)])


def _system_turn(tokenizer: Tokenizer, tools: list[dict] | None) -> str | None:
    try:
        return tokenizer.apply_chat_template([{"role": "system", "content": MARKER}], tools=tools,
                                             add_generation_prompt=False)
    except (jinja2.TemplateError, ModelLoadError):
        return None
