"""The agent loop on an OpenAI-compatible server, driven by scripted server replies against a real
workspace: the agent, the run's loop (swarm/run/agent_loop.py) and the OpenAI backend are real."""
import asyncio
import copy
import shutil
from types import SimpleNamespace

import pytest

from engine.sampling import SamplingParams
from swarm.agents.agent import Agent, AgentLimits
from swarm.agents.progress import AgentState
from swarm.agents.tools import ToolBox
from swarm.agents.workspace import Workspace
from swarm.run.agent_loop import AgentLoop
from swarm.run.openai_backend import OpenAIBackend
from swarm.run.openai_client import AssistantReply, ContextFullError, RemoteError
from swarm.spec.schema import load_spec
from tests.helpers.runs import EXAMPLE_WORKSPACE, TINY_HARNESS, write_run_spec

SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "# Agent\nName: a1\n# Task\nFix it."}


def structured(name: str, arguments: str, call_id: str) -> SimpleNamespace:
    return SimpleNamespace(index=0, id=call_id, function=SimpleNamespace(name=name, arguments=arguments))


class ScriptedServer:
    """Plays the server: each turn streams its text piece by piece, then the usage."""

    def __init__(self, turns: list[dict]):
        self.turns = list(turns)
        self.requests: list[dict] = []

    async def stream_turn(self, messages, tools, params, reply: AssistantReply, on_pieces):
        self.requests.append({"messages": copy.deepcopy(messages), "tools": tools, "params": params})
        turn = self.turns.pop(0)
        if isinstance(turn, Exception):
            raise turn
        for word in turn.get("content", "").split(" "):
            reply.add_delta(SimpleNamespace(content=word + " ", tool_calls=None))
            on_pieces(1)
            await asyncio.sleep(turn.get("delay", 0))
        for index, call in enumerate(turn.get("calls", [])):
            call.index = index
            reply.add_delta(SimpleNamespace(content=None, tool_calls=[call]))
            on_pieces(1)
        reply.content = reply.content.strip()
        reply.finish_reason = turn.get("finish_reason") or ("tool_calls" if turn.get("calls") else "stop")
        prompt, completion, cached = turn.get("usage", (100, reply.pieces, 80))
        reply.add_usage(SimpleNamespace(prompt_tokens=prompt, completion_tokens=completion,
                                        prompt_tokens_details=SimpleNamespace(cached_tokens=cached)))
        return reply

    async def close(self):
        pass


@pytest.fixture
def workspace(tmp_path):
    shutil.copytree(EXAMPLE_WORKSPACE, tmp_path / "ws")
    return Workspace(tmp_path / "ws")


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spec")
    path = write_run_spec(folder, folder / "no-model-needed", agents=[{"name": "a1"}])
    path.write_text(path.read_text() + "backend: {type: openai, base_url: 'http://x/v1', model: m}\n")
    return load_spec(path, check_model=False)


def make_agent(workspace, events, max_turns=5, max_tokens=10_000) -> Agent:
    toolbox = ToolBox(workspace, ["read_file", "write_file"])
    return Agent("a1", toolbox, SamplingParams(max_tokens=64), AgentLimits(max_turns=max_turns, max_tokens=max_tokens),
                 events.append, usage=True)


def start(spec, agent: Agent, server: ScriptedServer) -> AgentLoop:
    """The run's loop on the OpenAI backend, with the agent's first turn sent."""
    backend = OpenAIBackend(spec, client=server)
    first = backend.add_agent(agent.name, [SYSTEM, USER], TINY_HARNESS["tools"])
    loop = AgentLoop(backend, [agent])
    loop.start({agent.name: first})
    return loop


def run(spec, agent: Agent, server: ScriptedServer) -> None:
    """The whole conversation, as the run drives it."""
    loop = start(spec, agent, server)
    try:
        while not loop.done:
            loop.resume_agents()
            loop.advance()
    finally:
        loop.backend.close()


def kinds(events) -> list[str]:
    return [event.kind for event in events]


def test_structured_calls_run_and_their_results_answer_the_call_ids(spec, workspace):
    events = []
    agent = make_agent(workspace, events)
    server = ScriptedServer([
        {"calls": [structured("read_file", '{"path": "README.md"}', "call_abc"),
                   structured("write_file", '{"path": "notes.txt", "content": "hi"}', "call_def")],
         "usage": (100, 30, 0)},
        {"content": "Done reading.", "usage": (260, 3, 130)}])
    run(spec, agent, server)
    assert kinds(events) == ["message", "message", "prefilled", "assistant", "tool_call", "tool_call",
                             "tool_result", "tool_result", "prefilled", "assistant", "end"]
    assert agent.state is AgentState.DONE and agent.end_reason == "final_answer" and agent.tool_calls == 2
    second = server.requests[1]["messages"]
    assert second[:2] == [SYSTEM, USER]  # every turn re-sends the same prefix
    assert second[2]["role"] == "assistant" and [c["id"] for c in second[2]["tool_calls"]] == ["call_abc", "call_def"]
    assert [(m["role"], m["tool_call_id"]) for m in second[3:]] == [("tool", "call_abc"), ("tool", "call_def")]
    assert second[3]["content"].startswith("   1 | # textkit") and second[4]["content"].startswith("wrote")
    assert (workspace.root / "notes.txt").read_text() == "hi"
    usage = agent.usage
    assert (agent.prompt_tokens, usage.prompt_tokens_total, usage.cached_tokens_total) == (100, 360, 130)
    assert (usage.first_cached_tokens, usage.last_cached_tokens, usage.last_prompt_tokens) == (0, 130, 260)
    assert agent.generated_tokens == 33 and agent.context_tokens == 263
    assert agent.tool_tokens == 260 - 130  # what the results added, from the second turn's usage
    assert events[-1].data["cached_tokens"] == 130 and events[3].data["tool_calls"][0]["id"] == "call_abc"


def test_text_calls_from_a_server_without_a_tool_parser_get_made_up_ids(spec, workspace):
    events = []
    agent = make_agent(workspace, events)
    server = ScriptedServer([
        {"content": 'Look. <tool_call>{"name": "read_file", "arguments": {"path": "README.md"}}</tool_call> '
                    '<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>'},
        {"content": "Fine."}])
    run(spec, agent, server)
    assert kinds(events)[3:8] == ["assistant", "tool_call", "tool_error", "tool_result", "prefilled"]
    history = server.requests[1]["messages"]
    assert history[2] == {"role": "assistant", "content": server.requests[1]["messages"][2]["content"]}
    assert "tool_calls" not in history[2] and history[2]["content"].startswith("Look. <tool_call>")
    assert [m["tool_call_id"] for m in history[3:]] == ["call_1_1", "call_1_2"]
    assert "was not run" in history[4]["content"] and agent.tool_calls == 1


def test_a_malformed_structured_call_is_answered_with_the_error(spec, workspace):
    events = []
    agent = make_agent(workspace, events)
    server = ScriptedServer([{"calls": [structured("read_file", '{"path": ', "call_x")]}, {"content": "ok"}])
    run(spec, agent, server)
    assert "tool_error" in kinds(events) and agent.tool_calls == 0
    assert server.requests[1]["messages"][3]["tool_call_id"] == "call_x"


def test_limits_end_the_agent_and_each_turn_asks_for_what_is_left(spec, workspace):
    events = []
    agent = make_agent(workspace, events, max_turns=2)
    call = {"content": '<tool_call>{"name": "read_file", "arguments": {"path": "README.md"}}</tool_call>'}
    run(spec, agent, ScriptedServer([call, call, call]))
    assert agent.end_reason == "max_turns" and agent.turn == 2

    agent = make_agent(workspace, [], max_tokens=70)
    server = ScriptedServer([{**call, "usage": (100, 50, 0)}, {**call, "usage": (200, 30, 100)}])
    run(spec, agent, server)
    assert agent.end_reason == "max_tokens" and agent.generated_tokens == 80
    assert [r["params"].max_tokens for r in server.requests] == [64, 20]
    assert all(r["params"].stop == [] for r in server.requests)


def test_a_reply_cut_at_max_tokens_is_not_a_final_answer(spec, workspace):
    agent = make_agent(workspace, [])
    run(spec, agent, ScriptedServer([{"content": "I will start by", "finish_reason": "length"}]))
    assert agent.state is AgentState.DONE and agent.end_reason == "length" and agent.turn == 1

    agent = make_agent(workspace, [], max_tokens=50)
    run(spec, agent, ScriptedServer([{"content": "I will start by", "finish_reason": "length", "usage": (100, 50, 0)}]))
    assert agent.end_reason == "max_tokens"


def test_server_errors_end_the_agent(spec, workspace):
    agent = make_agent(workspace, [])
    run(spec, agent, ScriptedServer([RemoteError("http://x/v1 failed the request (500: boom)")]))
    assert agent.state is AgentState.ERROR and agent.end_reason == "error" and "boom" in agent.error

    agent = make_agent(workspace, [])
    call = {"content": '<tool_call>{"name": "read_file", "arguments": {"path": "README.md"}}</tool_call>'}
    run(spec, agent, ScriptedServer([call, ContextFullError("http://x/v1: the conversation no longer fits")]))
    assert agent.state is AgentState.DONE and agent.end_reason == "context_full"


def test_cached_tokens_stay_unknown_when_the_server_does_not_report_them(spec, workspace):
    agent = make_agent(workspace, [])
    run(spec, agent, ScriptedServer([{"content": "done", "usage": (100, 1, None)}]))
    assert agent.usage.cached_tokens_total is None and agent.usage.prompt_tokens_total == 100


@pytest.mark.parametrize("reason, state", [("interrupted", AgentState.INTERRUPTED), ("wall_time", AgentState.DONE)])
def test_cancelling_mid_turn_keeps_the_partial_reply(spec, workspace, reason, state):
    events = []
    agent = make_agent(workspace, events)
    loop = start(spec, agent, ScriptedServer([{"content": "a b c d e f g h", "delay": 0.05}]))
    try:
        while agent.generated_tokens < 3:
            loop.advance()
        loop.stop_agents(reason)
    finally:
        loop.backend.close()
    partial = [e for e in events if e.kind == "assistant"][-1]
    assert partial.data["partial"] and partial.data["tokens"] >= 3 and partial.data["content"].startswith("a b c")
    assert agent.state is state and agent.end_reason == (reason or "interrupted")
    assert agent.turn == partial.data["turn"] == events[-1].data["turns"] == 1  # the cut turn counts
    assert events[-1].kind == "end" and agent.first_token_at is not None
