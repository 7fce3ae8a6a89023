"""The agent loop, driven by scripted model output against a fake engine and a real workspace."""
import shutil

import pytest

from engine.sampling import SamplingParams
from engine.sequence import Sequence, SequenceStatus
from swarm.agents.agent import Agent, AgentLimits, AgentState
from swarm.agents.tool_response import ToolResponseFormat
from swarm.agents.tools import ToolBox
from swarm.agents.workspace import Workspace
from tests.helpers.runs import EOS_ID, EXAMPLE_WORKSPACE, tiny_tokenizer

READ_README = '<tool_call>{"name": "read_file", "arguments": {"path": "README.md"}}</tool_call>'


class FakeEngine:
    """The engine calls an agent makes; `generate` plays the model for one turn."""

    def __init__(self):
        self.tokenizer = tiny_tokenizer()
        self.eos_token_ids = {EOS_ID}
        self.extended: list[list[int]] = []
        self.released: list[Sequence] = []

    def add_request(self, prompt_ids, params, request_id="", keep_kv=False):
        assert keep_kv, "an agent keeps its KV between turns"
        return Sequence(list(prompt_ids), params, request_id=request_id)

    def extend(self, seq, token_ids, params=None):
        self.extended.append(list(token_ids))
        seq.token_ids += token_ids
        seq.num_prompt_tokens = len(seq.token_ids)
        seq.params = params or seq.params

    def release(self, seq):
        self.released.append(seq)
        seq.status = SequenceStatus.FINISHED

    def generate(self, agent: Agent, text: str, eos: bool = True, reason: str = "stop"):
        agent.on_prefilled()
        tokens = self.tokenizer.encode(text) + ([EOS_ID] if eos else [])
        for token in tokens:
            agent.seq.token_ids.append(token)
            agent.on_token(0.0)
        agent.seq.finish_reason = reason
        return agent.on_turn_end(self)


@pytest.fixture
def workspace(tmp_path):
    shutil.copytree(EXAMPLE_WORKSPACE, tmp_path / "ws")
    return Workspace(tmp_path / "ws")


def make_agent(workspace, events, max_turns=5, max_tokens=10_000, max_context=100_000):
    toolbox = ToolBox(workspace, ["list_dir", "read_file", "write_file"])
    return Agent("a1", tiny_tokenizer().encode("<|im_start|>user\nfix it<|im_end|>\n<|im_start|>assistant\n"),
                 toolbox, ToolResponseFormat(tiny_tokenizer()), SamplingParams(max_tokens=64, stop=["</tool_call>"]),
                 AgentLimits(max_turns=max_turns, max_tokens=max_tokens, max_context=max_context), events.append)


def kinds(events):
    return [event.kind for event in events]


def test_tool_call_runs_and_its_result_is_appended_in_the_chat_format(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    agent.start(engine)
    assert agent.state is AgentState.PREFILL
    job = engine.generate(agent, READ_README, eos=False)
    assert agent.state is AgentState.TOOL and [c.name for c in job.calls] == ["read_file"]
    agent.resume(engine, job.run(agent.toolbox))
    appended = engine.tokenizer.decode(engine.extended[0], skip_special_tokens=False)
    assert appended.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n   1 | # textkit")
    assert appended.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert agent.state is AgentState.PREFILL and agent.last_tool == "read_file"
    engine.generate(agent, "The README describes textkit.")
    assert agent.state is AgentState.DONE and agent.end_reason == "final_answer"
    assert kinds(events) == ["prefilled", "assistant", "tool_call", "tool_result", "prefilled", "assistant", "end"]
    assert engine.released == [agent.seq] and agent.turn == 2 and agent.tool_calls == 1


def test_history_is_append_only(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    agent.start(engine)
    before = list(agent.seq.token_ids)
    job = engine.generate(agent, READ_README, eos=False)
    after_turn = list(agent.seq.token_ids)
    agent.resume(engine, job.run(agent.toolbox))
    assert agent.seq.token_ids[:len(before)] == before
    assert agent.seq.token_ids[:len(after_turn)] == after_turn
    assert agent.seq.token_ids == after_turn + engine.extended[0]


def test_malformed_call_returns_an_error_to_the_agent_and_the_run_goes_on(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    agent.start(engine)
    job = engine.generate(agent, '<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>', eos=False)
    assert job.calls == [] and job.errors
    agent.resume(engine, job.run(agent.toolbox))
    appended = engine.tokenizer.decode(engine.extended[0], skip_special_tokens=False)
    assert "was not run" in appended and "valid JSON" in appended
    assert agent.state is AgentState.PREFILL and kinds(events)[-1] == "tool_error"


@pytest.mark.parametrize("call, message", [
    ('{"name": "delete_everything", "arguments": {}}', "unknown tool"),
    ('{"name": "read_file", "arguments": {"file": "a"}}', "has no argument"),
    ('{"name": "read_file", "arguments": {"path": "../../etc/passwd"}}', "leaves the workspace"),
    ('{"name": "read_file", "arguments": {"path": "/etc/passwd"}}', "absolute"),
])
def test_bad_calls_and_escapes_come_back_as_error_results(workspace, call, message):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    agent.start(engine)
    job = engine.generate(agent, call)  # the bare JSON form small models write
    agent.resume(engine, job.run(agent.toolbox))
    result = [e for e in events if e.kind == "tool_result"][0]
    assert not result.data["ok"] and message in result.data["output"]
    assert agent.state is AgentState.PREFILL


def test_write_file_changes_only_the_agents_workspace(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    agent.start(engine)
    call = '<tool_call>{"name": "write_file", "arguments": {"path": "notes.txt", "content": "hi"}}</tool_call>'
    agent.resume(engine, engine.generate(agent, call, eos=False).run(agent.toolbox))
    assert (workspace.root / "notes.txt").read_text() == "hi"
    assert not (EXAMPLE_WORKSPACE / "notes.txt").exists()


def test_turn_limit_ends_the_agent(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events, max_turns=2)
    agent.start(engine)
    agent.resume(engine, engine.generate(agent, READ_README, eos=False).run(agent.toolbox))
    assert engine.generate(agent, READ_README, eos=False) is None
    assert agent.state is AgentState.DONE and agent.end_reason == "max_turns" and agent.turn == 2


def test_token_limit_ends_the_agent_and_caps_each_turn(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events, max_tokens=40)
    agent.start(engine)
    assert agent.seq.params.max_tokens == 40
    engine.generate(agent, READ_README + "x" * 40, eos=False, reason="length")
    assert agent.end_reason == "max_tokens"


def test_a_turn_cut_at_sampling_max_tokens_is_not_a_final_answer(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    agent.start(engine)
    assert engine.generate(agent, "I will start by reading", eos=False, reason="length") is None
    assert agent.state is AgentState.DONE and agent.end_reason == "length" and agent.turn == 1
    assert events[-1].data["reason"] == "length"


def test_a_turn_cut_by_the_agents_token_limit_or_the_context_says_which(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events, max_tokens=5)
    agent.start(engine)
    engine.generate(agent, "x" * 40, eos=False, reason="length")
    assert agent.end_reason == "max_tokens"

    agent = make_agent(workspace, events, max_context=50)  # the prompt is 22 tokens
    agent.start(engine)
    assert agent.seq.params.max_tokens == 28
    engine.generate(agent, "x" * 28, eos=False, reason="length")
    assert agent.end_reason == "context_full"


def test_context_full_ends_the_agent_before_appending(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events, max_context=120)
    agent.start(engine)
    agent.resume(engine, engine.generate(agent, READ_README, eos=False).run(agent.toolbox))
    assert agent.end_reason == "context_full" and engine.extended == []


def test_stop_keeps_the_partial_turn_in_the_transcript(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    agent.start(engine)
    agent.on_prefilled()
    for token in engine.tokenizer.encode("I will read"):
        agent.seq.token_ids.append(token)
    agent.stop(engine, "interrupted")
    assert agent.state is AgentState.INTERRUPTED
    partial, end = events[-2], events[-1]
    assert partial.kind == "assistant" and partial.data["partial"] and partial.data["content"] == "I will read"
    assert end.kind == "end" and end.data["reason"] == "interrupted"
    assert agent.turn == partial.data["turn"] == end.data["turns"] == 1  # the cut turn counts


def test_wall_time_ends_the_agent_mid_turn_and_counts_that_turn(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    agent.start(engine)
    agent.resume(engine, engine.generate(agent, READ_README, eos=False).run(agent.toolbox))
    agent.on_prefilled()
    agent.seq.token_ids += engine.tokenizer.encode("The README")
    agent.stop(engine, "wall_time")
    assert (agent.state, agent.end_reason, agent.turn) == (AgentState.DONE, "wall_time", 2)
    assert events[-2].data["turn"] == 2 and events[-2].data["finish_reason"] == "wall_time"


def test_results_arriving_after_the_agent_ended_are_dropped(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    agent.start(engine)
    job = engine.generate(agent, READ_README, eos=False)
    agent.stop(engine, "wall_time")
    agent.resume(engine, job.run(agent.toolbox))
    assert engine.extended == [] and agent.end_reason == "wall_time"


def test_engine_error_ends_the_agent_with_its_message(workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    agent.start(engine)
    agent.seq.finish_reason, agent.seq.error = "error", "needs more KV than the pool holds"
    assert agent.on_turn_end(engine) is None
    assert agent.state is AgentState.ERROR and "more KV" in agent.error
