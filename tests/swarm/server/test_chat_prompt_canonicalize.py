"""`swarm serve --canonicalize`: the prompter renders every API's requests canonicalized, a real server
shares the whole system turn between agents in different folders, and logs and counts what it moved."""
import json
import logging
from pathlib import Path

import pytest

from engine import EngineOptions
from swarm.server.anthropic_protocol import chat_inputs_from_body
from swarm.server.canonicalize import Canonicalizer, canonicalize
from swarm.server.chat_prompt import ChatPrompter
from swarm.server.metrics import CanonicalizedCounts
from swarm.server.protocol import ChatMessage
from tests.helpers.runs import TINY_HARNESS, tiny_model, tiny_tokenizer
from tests.helpers.serving import MODEL, ServerThread, start_engine

CLAUDE_CODE = Path(__file__).resolve().parents[2] / "data" / "harness_requests" / "claude-code" / "alpha-1.json"
STATIC = " ".join(f"Rule {n}: read the code before changing it, and keep each change small." for n in range(12))
TOOLS = TINY_HARNESS["tools"]


def env_block(cwd: str) -> str:
    return f"<env>\n  Working directory: {cwd}\n  Platform: linux\n</env>"


def system(cwd: str) -> dict:
    return {"role": "system", "content": f"You are a coding agent.\n{env_block(cwd)}\n{STATIC}"}


def shared_tokens(prompter: ChatPrompter, *cwds: str) -> int:
    a, b = (prompter.build([ChatMessage.model_validate(system(cwd)),
                            ChatMessage(role="user", content="Fix a.py")], TOOLS).token_ids for cwd in cwds)
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


def test_the_prompter_renders_a_request_as_canonicalize_leaves_it_and_counts_it():
    tokenizer = tiny_tokenizer()
    inputs = chat_inputs_from_body(json.loads(CLAUDE_CODE.read_text()))
    counts = CanonicalizedCounts()
    hooked = ChatPrompter(tokenizer, Canonicalizer(counts)).build(inputs.messages, inputs.tools, inputs.tool_choice)
    result = canonicalize(inputs)
    assert hooked.token_ids == ChatPrompter(tokenizer).build(result.inputs.messages, inputs.tools).token_ids
    samples = {s.name + str(s.labels): s.value for metric in counts.collect() for s in metric.samples}
    assert samples["swarm_canonicalized_requests_total{}"] == 1
    assert samples["swarm_canonicalized_chars_total{'rule': 'git_status'}"] == sum(
        len(m.text) for m in result.moves if m.rule == "git_status")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerThread(start_engine(tiny_model(tmp_path_factory.getbasetemp())), canonicalize=True) as running:
        yield running


def test_agents_in_two_folders_share_the_whole_system_turn_and_the_server_counts_and_logs_it(server, caplog):
    caplog.set_level(logging.INFO, logger="swarm.serve")
    tokenizer, block = tiny_tokenizer(), EngineOptions().block_size
    without = shared_tokens(ChatPrompter(tokenizer), "/work/alpha", "/work/beta")
    canonicalizing = ChatPrompter(tokenizer, Canonicalizer(CanonicalizedCounts()))
    with_flag = shared_tokens(canonicalizing, "/work/alpha", "/work/beta")
    assert with_flag // block > without // block + 2
    client, before = server.client(), server.metrics()
    caplog.clear()
    for cwd in ("/work/alpha", "/work/beta"):
        messages = [system(cwd), {"role": "user", "content": "Fix a.py"}]
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=1)
    assert reply.usage.prompt_tokens_details.cached_tokens >= with_flag // block * block
    client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": STATIC},
                                                          {"role": "user", "content": "Fix a.py"}], max_tokens=1)
    after = server.metrics()
    counted = after["swarm_canonicalized_requests_total"] - before.get("swarm_canonicalized_requests_total", 0)
    moved = after['swarm_canonicalized_chars_total{rule="env_block"}'] - before.get(
        'swarm_canonicalized_chars_total{rule="env_block"}', 0)
    assert counted == 2 and moved == len(env_block("/work/alpha")) + len(env_block("/work/beta"))
    logged = [r.getMessage() for r in caplog.records if r.name == "swarm.serve" and "canonicalize" in r.getMessage()]
    assert len(logged) == 2 and all("env_block" in line for line in logged)
