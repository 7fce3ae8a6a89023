"""--canonicalize on real harness requests (tests/data/harness_requests: two agents of each harness in
folders alpha and beta) and on fixtures of what their public prompts hold: what it moves, where it
goes, and where two agents' prompts part before and after."""
import json
from pathlib import Path

import pytest

from swarm.server import anthropic_protocol, openai_routes
from swarm.server.canonicalize import canonicalize
from swarm.server.chat_prompt import ChatPrompter
from swarm.server.generation import ChatInputs
from swarm.server.protocol import ChatMessage, ContentPart
from swarm.trunk.canonicalize import MOVED_HEADER
from tests.helpers.chat_templates import QWEN_TOOLS
from tests.helpers.spec_files import with_template

CAPTURES = Path(__file__).resolve().parents[2] / "data" / "harness_requests"
CONVERTERS = {"claude-code": anthropic_protocol.chat_inputs_from_body, "opencode": openai_routes.chat_inputs_from_body,
              "aider": openai_routes.chat_inputs_from_body, "mini-swe-agent": openai_routes.chat_inputs_from_body}


def captured(harness: str, folder: str) -> ChatInputs:
    body = json.loads((CAPTURES / harness / f"{folder}-1.json").read_text())
    return CONVERTERS[harness](body)


def shared_text(prompter: ChatPrompter, alpha: ChatInputs, beta: ChatInputs) -> str:
    """The prompt text two requests share: up to the first token where their ids differ."""
    a, b = (prompter.build(i.messages, i.tools, i.tool_choice).token_ids for i in (alpha, beta))
    index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return prompter.tokenizer.decode(a[:index], skip_special_tokens=False)


def first_user_text(inputs: ChatInputs) -> str:
    return next(m for m in inputs.messages if m.role == "user").text()


@pytest.mark.parametrize("harness, rules, tail", [
    ("claude-code", {"billing_header", "claude_code_memory", "claude_code_env", "git_status"},
     "memory at `/work/harness-home/claude/.claude/projects/-work-harness-projects-"),
    ("opencode", {"env_block"}, "<env>\n  Working directory: /work/harness-projects/"),
])
def test_two_folders_share_the_whole_system_turn_once_canonicalized(harness, rules, tail):
    prompter = ChatPrompter(with_template(QWEN_TOOLS))
    alpha, beta = captured(harness, "alpha"), captured(harness, "beta")
    before = shared_text(prompter, alpha, beta)
    assert "<|im_start|>user" not in before and "</tools>" in before   # parted in the system text, after the tools
    done = [canonicalize(alpha), canonicalize(beta)]
    assert {move.rule for move in done[0].moves} == rules
    after = shared_text(prompter, done[0].inputs, done[1].inputs)
    assert f"<|im_start|>user\n{MOVED_HEADER}\n\n" in after and after.endswith(tail)
    assert len(after) > len(before)
    for move in done[0].moves:
        assert move.text in first_user_text(done[0].inputs)
        assert all(move.text not in m.text() for m in done[0].inputs.messages if m.role == "system")
    assert first_user_text(done[0].inputs).endswith(first_user_text(alpha))


def test_aiders_platform_and_date_lines_move_and_its_two_requests_stay_identical():
    alpha, beta = canonicalize(captured("aider", "alpha")), canonicalize(captured("aider", "beta"))
    assert [move.text for move in alpha.moves] == [
        "- Platform: Linux-6.18.44-fc-v1098-x86_64-with-glibc2.36", "- Shell: SHELL=/bin/bash",
        "- Current date: 2026-12-02"]
    system = alpha.inputs.messages[0].text()
    assert "Use the appropriate shell based on the user's system info:\n- Language: English\n" in system
    assert [m.model_dump() for m in alpha.inputs.messages] == [m.model_dump() for m in beta.inputs.messages]


def test_a_request_with_no_finding_comes_back_unchanged():
    inputs = captured("mini-swe-agent", "alpha")
    dumped = [m.model_dump_json() for m in inputs.messages]
    result = canonicalize(inputs)
    assert result.moves == [] and result.inputs is inputs
    assert [m.model_dump_json() for m in result.inputs.messages] == dumped
    plain = ChatInputs([ChatMessage(role="system", content=[ContentPart(type="text", text="You are a coding agent.")]),
                        ChatMessage(role="user", content="Fix a.py")])
    assert canonicalize(plain).inputs is plain


OLD_CLAUDE_CODE = """\
You are Claude Code, Anthropic's official CLI for Claude.

Here is useful information about the environment you are running in:
<env>
Working directory: /home/dev/projects/alpha
Is directory a git repo: Yes
Platform: linux
OS Version: Linux 6.8.0-45-generic
Today's date: 2025-06-01
</env>
You are powered by the model named Sonnet 4.

gitStatus: This is the git status at the start of the conversation.
Current branch: feature/parser

Status:
M src/parser.py

Recent commits:
3f2a9c1 Fix the tokenizer"""


def test_claude_codes_env_block_billing_header_and_git_status_move_as_blocks():
    billing = "x-anthropic-billing-header: cc_version=1.0.88.3f1; cc_entrypoint=cli; cch=8e2b41c0a9;"
    system = ChatMessage(role="system", content=[ContentPart(type="text", text=billing),
                                                 ContentPart(type="text", text=OLD_CLAUDE_CODE)])
    user = ChatMessage(role="user", content=[ContentPart(type="text", text="Fix the parser.")])
    result = canonicalize(ChatInputs([system, user]))
    assert [m.rule for m in result.moves] == ["billing_header", "env_block", "git_status"]
    kept, moved_user = result.inputs.messages
    assert kept.text() == ("You are Claude Code, Anthropic's official CLI for Claude.\n\nHere is useful information "
                           "about the environment you are running in:\nYou are powered by the model named Sonnet 4.")
    env = ("<env>\nWorking directory: /home/dev/projects/alpha\nIs directory a git repo: Yes\nPlatform: linux\n"
           "OS Version: Linux 6.8.0-45-generic\nToday's date: 2025-06-01\n</env>")
    git_status = OLD_CLAUDE_CODE[OLD_CLAUDE_CODE.index("gitStatus:"):]
    assert moved_user.text() == "\n\n".join([MOVED_HEADER, billing, env, git_status, "Fix the parser."])


def test_without_a_user_message_the_moved_text_gets_one_after_the_system_messages():
    inputs = ChatInputs([ChatMessage(role="system", content="Be brief.\nToday's date: 2025-06-01"),
                         ChatMessage(role="developer", content="Cwd: /srv/agents/alpha"),
                         ChatMessage(role="assistant", content="Hello.")])
    result = canonicalize(inputs)
    assert [(m.role, m.text()) for m in result.inputs.messages] == [
        ("system", "Be brief."), ("developer", ""),
        ("user", f"{MOVED_HEADER}\n\nToday's date: 2025-06-01\n\nCwd: /srv/agents/alpha"), ("assistant", "Hello.")]
