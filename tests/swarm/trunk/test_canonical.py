import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import SpecError
from swarm.spec.schema import AgentSpec, load_spec
from swarm.trunk.canonical import build_prompts, common_prefix_length, rules_text, token_ids_sha256
from tests.helpers.chat_templates import LLAMA31_TOOLS_IN_USER, QWEN_TOOLS
from tests.helpers.spec_files import (
    EXAMPLE_SPEC,
    FIXED_ENV,
    MINIMAL,
    REPO,
    default_tokenizer,
    load,
    prompts_for,
    with_template,
)

CODING_AGENT = REPO / "harness_templates" / "coding-agent.json"


def test_every_agent_prompt_begins_with_exactly_the_trunk_ids():
    prompts, _, _ = prompts_for(load_spec(EXAMPLE_SPEC))
    trunk = prompts.trunk.token_ids
    assert len(trunk) > 500
    for agent in prompts.agents:
        assert agent.prompt_ids[:len(trunk)] == trunk
        assert agent.system_ids == trunk
        assert len(agent.prompt_ids) == len(trunk) + len(agent.suffix_ids)


def test_trunk_and_suffix_are_tokenized_on_their_own():
    tokenizer = default_tokenizer()
    prompts, _, _ = prompts_for(load_spec(EXAMPLE_SPEC))
    assert prompts.trunk.token_ids == tokenizer.encode(prompts.trunk.text)
    assert prompts.trunk.sha256 == token_ids_sha256(tokenizer.encode(prompts.trunk.text))
    for agent in prompts.agents:
        assert agent.suffix_ids == tokenizer.encode(agent.suffix_text)
        assert agent.suffix_text.startswith("<|im_start|>user\n")
        assert agent.suffix_text.endswith("<|im_start|>assistant\n")


def test_everything_volatile_is_in_the_suffix_and_nothing_in_the_trunk():
    spec = load_spec(EXAMPLE_SPEC)
    prompts, _, _ = prompts_for(spec)
    for agent, prompt in zip(spec.agents, prompts.agents):
        for value in (agent.name, agent.task, FIXED_ENV.date, FIXED_ENV.platform, f"/w/{agent.name}"):
            assert value not in prompts.trunk.text
            assert value in prompt.suffix_text
        for key, value in agent.context.items():
            assert f"{key}: {value}" in prompt.suffix_text
    assert "Python 3.10" in prompts.trunk.text
    assert '"name": "run_command"' in prompts.trunk.text


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,12}", fullmatch=True),
                          st.text(min_size=1, max_size=60)), min_size=1, max_size=4))
def test_any_names_and_tasks_keep_the_trunk_intact(agents):
    spec = load_spec(EXAMPLE_SPEC)
    specs = [AgentSpec(name=f"{i}{name}", task=task) for i, (name, task) in enumerate(agents)]
    prompts, _, _ = prompts_for(spec)
    reference = prompts.trunk.token_ids
    environments = {a.name: FIXED_ENV for a in specs}
    again = build_prompts(default_tokenizer(), prompts_for(spec)[1], specs, environments)
    assert again.trunk.token_ids == reference
    for agent in again.agents:
        assert agent.prompt_ids[:len(reference)] == reference


def _shuffled_harness(tmp_path, seed: int):
    harness = json.loads(CODING_AGENT.read_text())
    rng = random.Random(seed)
    rng.shuffle(harness["tools"])
    tools = [{"function": dict(reversed(list(t["function"].items()))), "type": "function"} for t in harness["tools"]]
    harness["tools"] = tools
    path = tmp_path / f"harness-{seed}.json"
    path.write_text(json.dumps(harness, indent=seed % 4 or None, separators=(",", ":") if seed % 2 else None))
    return path


@pytest.mark.parametrize("tokenizer", [None, with_template(QWEN_TOOLS)], ids=["tools-block", "native"])
def test_tool_order_and_formatting_give_identical_trunk_bytes(tmp_path, tokenizer):
    extra = ['{name: ping, description: "Ping it.", parameters: {type: object, properties: {}}}',
             '{type: function, function: {parameters: {properties: {a: {type: string}, b: {type: integer}},'
             ' type: object, required: [b, a]}, name: add}}']
    texts = []
    for seed in range(4):
        tools = extra if seed % 2 else list(reversed(extra))
        tools = [t.replace("required: [b, a]", "required: [a, b]") if seed == 3 else t for t in tools]
        spec = load(tmp_path, MINIMAL + f"harness: {_shuffled_harness(tmp_path, seed).name}\n"
                    + "extra_tools:\n" + "".join(f"  - {t}\n" for t in tools))
        prompts, _, _ = prompts_for(spec, tokenizer)
        texts.append((prompts.trunk.text.encode(), prompts.trunk.sha256))
    assert len(set(texts)) == 1
    text = texts[0][0].decode()
    assert text.index('"name": "add"') < text.index('"name": "list_dir"') < text.index('"name": "ping"')


def test_native_tool_template_renders_tools_in_the_trunk_like_transformers_but_before_the_rules(tmp_path):
    from transformers import PreTrainedTokenizerFast
    tokenizer = with_template(QWEN_TOOLS)
    spec = load(tmp_path, MINIMAL)
    prompts, source, _ = prompts_for(spec, tokenizer)
    assert prompts.trunk.tools_mode == "chat-template"
    oracle = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend, chat_template=QWEN_TOOLS)
    rules = rules_text([segment.text for segment in source.rules])
    tools = [segment.tool for segment in source.tools]
    head, tail = "<|im_start|>system\n", "<|im_end|>\n"
    template_order = oracle.apply_chat_template([{"role": "system", "content": rules}], tools=tools, tokenize=False)
    tools_words = template_order.removeprefix(f"{head}{rules}\n\n").removesuffix(tail)
    assert tools_words.startswith("# Tools") and '"name": "write_file"' in tools_words
    assert prompts.trunk.text == f"{head}{tools_words}\n\n{rules}{tail}"
    for agent in prompts.agents:
        assert agent.prompt_ids[:len(prompts.trunk.token_ids)] == prompts.trunk.token_ids


def test_template_that_puts_tools_in_the_user_message_gets_a_tools_block(tmp_path):
    prompts, _, _ = prompts_for(load(tmp_path, MINIMAL), with_template(LLAMA31_TOOLS_IN_USER))
    assert prompts.trunk.tools_mode == "tools-block"
    assert "<tools>\n" in prompts.trunk.text and '"name": "search"' in prompts.trunk.text
    assert all('"name": "search"' not in agent.suffix_text for agent in prompts.agents)


def test_disabled_run_command_leaves_the_tool_out(tmp_path):
    prompts, source, _ = prompts_for(load(tmp_path, MINIMAL + "run_command: {enabled: false}\n"))
    assert '"name": "run_command"' not in prompts.trunk.text
    assert [s.tool["function"]["name"] for s in source.tools] == ["list_dir", "read_file", "search", "write_file"]


def test_an_extra_tool_named_like_a_harness_tool_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match=r"swarm.yaml:5: extra_tools\[0\]: the harness already has"):
        load(tmp_path, MINIMAL + "extra_tools:\n  - {name: read_file, parameters: {type: object}}\n")


def test_per_agent_variables_shrink_the_shared_trunk(tmp_path):
    spec = load(tmp_path, MINIMAL + 'extra_rules:\n  - "You are {{ name }}."\n')
    prompts, _, _ = prompts_for(spec)
    trunk = prompts.trunk.token_ids
    assert len(trunk) < len(prompts.agents[0].system_ids)
    assert "You are agent-1." in prompts.agents[0].system_text
    for agent in prompts.agents:
        assert agent.prompt_ids[:len(trunk)] == trunk
    assert "{{ name }}" in prompts.written.text


def test_trunk_token_at_maps_characters_to_tokens():
    prompts, _, _ = prompts_for(load_spec(EXAMPLE_SPEC))
    trunk = prompts.trunk
    at = trunk.text.index("Python 3.10")
    index = trunk.token_at(at)
    assert "Python" in default_tokenizer().decode(trunk.token_ids[index:index + 2])
    assert trunk.token_at(0) == 0


def test_common_prefix_length_is_how_many_tokens_every_sequence_starts_with():
    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert common_prefix_length([[1, 2], [1, 2, 3]]) == 2 and common_prefix_length([[7], [8]]) == 0
