"""The tools before the system text, for every chat template the tests know: two clients whose system
texts differ only in a tail share every token of the tools block, and serve's prompt for a harness is
still `swarm run`'s trunk and suffix, token for token."""
from dataclasses import replace

import pytest

from engine.loading.tokenizer import Tokenizer
from swarm.server.chat_prompt import ChatPrompter
from swarm.server.protocol import ChatMessage
from swarm.spec.tool_schema import canonical_tools
from swarm.trunk.canonical import agent_rules_text
from swarm.trunk.suffix import first_user_message
from swarm.trunk.tools_first import tools_first_layout
from tests.helpers.chat_templates import LLAMA31_TOOLS_IN_USER, QWEN3_TOOLS, QWEN_TOOLS
from tests.helpers.runs import TINY_HARNESS, tiny_tokenizer
from tests.helpers.spec_files import FIXED_ENV, MINIMAL, default_tokenizer, load, prompts_for, with_template

TOOLS = TINY_HARNESS["tools"]
TEMPLATES = {"chatml-no-tools": lambda: tiny_tokenizer(), "smollm2": default_tokenizer,
             "qwen2.5": lambda: with_template(QWEN_TOOLS), "qwen3": lambda: with_template(QWEN3_TOOLS),
             "llama3.1-tools-in-user": lambda: with_template(LLAMA31_TOOLS_IN_USER)}
NATIVE = ("qwen2.5", "qwen3")


def request(cwd: str) -> list[ChatMessage]:
    system = f"You are a coding agent.\n\nWorking directory: {cwd}\nToday's date: 2026-12-02"
    return [ChatMessage(role="system", content=system), ChatMessage(role="user", content="Fix a.py")]


def divergence(a: list[int], b: list[int]) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


@pytest.mark.parametrize("template", TEMPLATES)
def test_system_texts_that_differ_in_a_tail_share_the_whole_tools_block(template):
    tokenizer = TEMPLATES[template]()
    prompter = ChatPrompter(tokenizer)
    alpha = prompter.build(request("/work/alpha"), TOOLS).token_ids
    beta = prompter.build(request("/work/beta"), TOOLS).token_ids
    shared = tokenizer.decode(alpha[:divergence(alpha, beta)], skip_special_tokens=False)
    assert '"name": "read_file"' in shared and '"name": "write_file"' in shared
    assert shared.rindex("</tool_call>") < shared.index("You are a coding agent.")
    assert shared.endswith("Working directory: /work/")
    assert (tools_first_layout(tokenizer, canonical_tools(TOOLS)) is not None) == (template in NATIVE)


@pytest.mark.parametrize("template", NATIVE)
def test_the_templates_own_order_would_unshare_the_tools(template):
    """The oracle: the template itself, through transformers, puts the tools after the volatile tail."""
    from transformers import PreTrainedTokenizerFast
    tokenizer = TEMPLATES[template]()
    oracle = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend, chat_template=tokenizer.chat_template)
    texts = [[m.model_dump(exclude_none=True) for m in request(cwd)] for cwd in ("/work/alpha", "/work/beta")]
    alpha, beta = (tokenizer.encode(oracle.apply_chat_template(t, tools=TOOLS, tokenize=False)) for t in texts)
    shared = tokenizer.decode(alpha[:divergence(alpha, beta)], skip_special_tokens=False)
    assert "# Tools" not in shared and shared.endswith("Working directory: /work/")


@pytest.mark.parametrize("template", ["smollm2", "qwen2.5", "qwen3"])
def test_serve_renders_a_harness_exactly_as_swarm_runs_trunk_and_suffix(tmp_path, template):
    tokenizer: Tokenizer = TEMPLATES[template]()
    spec = load(tmp_path, MINIMAL + 'extra_rules:\n  - "You are {{ name }}."\n')
    prompts, source, _ = prompts_for(spec, tokenizer)
    rules = [segment.text for segment in source.rules]
    tools = [segment.tool for segment in source.tools]
    for agent, prompt in zip(spec.agents, prompts.agents):
        env = replace(FIXED_ENV, cwd=f"{FIXED_ENV.cwd}/{agent.name}")
        messages = [ChatMessage(role="system", content=agent_rules_text(rules, agent, env)),
                    ChatMessage(role="user", content=first_user_message(agent, env))]
        assert ChatPrompter(tokenizer).build(messages, list(reversed(tools))).token_ids == prompt.prompt_ids
    assert len(prompts.trunk.token_ids) > len(tokenizer.encode(prompts.trunk.text.split('"write_file"')[0]))
