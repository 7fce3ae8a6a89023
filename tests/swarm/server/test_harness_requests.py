"""The first requests real harnesses sent (tests/data/harness_requests: Claude Code, Codex, OpenCode,
aider, mini-swe-agent, each from two project folders), through serve's converters and prompter with
the tokenizer and template of serve's default model, SmolLM2. The oracle is the captured text itself:
the two folders' bodies differ only where the folder name is written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.loading.gguf_file import read_gguf_tokenizer
from swarm.server import anthropic_protocol, responses_protocol
from swarm.server.chat_prompt import ChatPrompt, ChatPrompter
from swarm.server.generation import ChatInputs
from swarm.server.protocol import ChatCompletionRequest
from tests.helpers.tiny_gguf import smollm2_or_skip

CAPTURES = Path(__file__).resolve().parents[2] / "data" / "harness_requests"
TASK = "Add a subtract function to calc.py"
API = {"claude-code": "messages", "codex": "responses", "opencode": "chat", "aider": "chat", "mini-swe-agent": "chat"}
WITH_CWD = ["claude-code", "codex", "opencode"]
WITHOUT_CWD = ["aider", "mini-swe-agent"]


@pytest.fixture(scope="module")
def tokenizer():
    return read_gguf_tokenizer(smollm2_or_skip())


def body_of(harness: str, folder: str) -> dict:
    return json.loads((CAPTURES / harness / f"{folder}-1.json").read_text())


def chat_inputs(harness: str, body: dict) -> ChatInputs:
    if API[harness] == "messages":
        return anthropic_protocol.chat_inputs_from_body(body)
    if API[harness] == "responses":
        return responses_protocol.chat_inputs_from_body(body)
    request = ChatCompletionRequest.model_validate(body)
    return ChatInputs(request.messages, request.tools, request.tool_choice)


def rendered(tokenizer, harness: str, folder: str) -> ChatPrompt:
    inputs = chat_inputs(harness, body_of(harness, folder))
    return ChatPrompter(tokenizer).build(inputs.messages, inputs.tools, inputs.tool_choice)


def function_tools_in(body: dict) -> int:
    """Tools the model can call, counted from the body: Codex nests five under a namespace and adds a
    hosted web_search tool, which a server that runs functions only does not offer."""
    count = 0
    for tool in body.get("tools") or []:
        if tool.get("type") == "namespace":
            count += len(tool["tools"])
        elif tool.get("type", "function") == "function" or "input_schema" in tool:
            count += 1
    return count


def divergence(first: list, second: list) -> int:
    return next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))


@pytest.mark.parametrize("folder", ["alpha", "beta"])
@pytest.mark.parametrize("harness", list(API))
def test_each_capture_converts_and_renders_as_serve_would(tokenizer, harness, folder):
    body = body_of(harness, folder)
    prompt = rendered(tokenizer, harness, folder)
    text = tokenizer.decode(prompt.token_ids, skip_special_tokens=False)
    assert len(prompt.tools) == function_tools_in(body)
    assert prompt.parse_tool_calls == bool(prompt.tools)
    assert TASK in text and text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("harness", WITH_CWD)
def test_two_folders_share_every_token_up_to_the_folder_name(tokenizer, harness):
    alpha, beta = (rendered(tokenizer, harness, folder).token_ids for folder in ("alpha", "beta"))
    alpha_text, beta_text = (tokenizer.decode(ids, skip_special_tokens=False) for ids in (alpha, beta))
    first_difference = divergence(alpha_text, beta_text)
    shared = tokenizer.decode(alpha[:divergence(alpha, beta)], skip_special_tokens=False)
    assert alpha_text[first_difference:].startswith("alpha") and beta_text[first_difference:].startswith("beta")
    assert alpha_text.startswith(shared) and first_difference - len(shared) < 8


@pytest.mark.parametrize("harness", ["claude-code", "opencode"])
def test_the_tools_block_is_shared_although_the_system_text_names_the_folder(tokenizer, harness):
    alpha, beta = (rendered(tokenizer, harness, folder).token_ids for folder in ("alpha", "beta"))
    shared = tokenizer.decode(alpha[:divergence(alpha, beta)], skip_special_tokens=False)
    body = body_of(harness, "alpha")
    system_text = json.dumps(body["system"] if harness == "claude-code" else body["messages"][0])
    assert "harness-projects" in system_text and "</tools>" in shared
    assert all(json.dumps(tool.get("name") or tool["function"]["name"]) in shared for tool in body["tools"])


@pytest.mark.parametrize("harness", WITHOUT_CWD)
def test_harnesses_that_never_write_the_folder_share_the_whole_prompt(tokenizer, harness):
    alpha, beta = (rendered(tokenizer, harness, folder).token_ids for folder in ("alpha", "beta"))
    assert alpha == beta
