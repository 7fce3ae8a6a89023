"""The agent loop on swarm's own engine, driven by scripted model output against a fake engine and a
real workspace: the agent, the run's loop (swarm/run/agent_loop.py) and the local backend are real."""
import shutil

import pytest

from engine.kv.stats import KVStats
from engine.llm_engine import StepResult
from engine.sampling import SamplingParams
from engine.sequence import Sequence, SequenceStatus
from swarm.agents.agent import Agent, AgentLimits, AgentState
from swarm.agents.tools import ToolBox
from swarm.agents.workspace import Workspace
from swarm.run.agent_loop import AgentLoop
from swarm.run.local_backend import LocalBackend
from swarm.spec.schema import load_spec
from tests.helpers.runs import EOS_ID, EXAMPLE_WORKSPACE, tiny_tokenizer, write_run_spec

READ_README = '<tool_call>{"name": "read_file", "arguments": {"path": "README.md"}}</tool_call>'
PROMPT = "<|im_start|>user\nfix it<|im_end|>\n<|im_start|>assistant\n"


class FakeEngine:
    """The engine calls the local backend makes; `play` scripts what the next step does for a sequence."""

    def __init__(self):
        self.tokenizer = tiny_tokenizer()
        self.eos_token_ids = {EOS_ID}
        self.extended: list[list[int]] = []
        self.released: list[Sequence] = []
        self.next_step = StepResult()

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

    def play(self, seq: Sequence, text: str, eos: bool = True, reason: str | None = "stop") -> None:
        """The next step computes what the sequence has uncomputed and writes `text`; `reason` ends the
        turn (None: the turn goes on)."""
        result = self.next_step
        if seq.num_computed_tokens < len(seq):
            seq.num_computed_tokens = len(seq)
            result.prefilled.append(seq)
        for token in self.tokenizer.encode(text) + ([EOS_ID] if eos else []):
            seq.token_ids.append(token)
            result.new_tokens.append((seq, token))
        seq.finish_reason = reason
        if reason is not None:
            result.finished.append(seq)

    def fail(self, seq: Sequence, error: str) -> None:
        seq.finish_reason, seq.error = "error", error
        self.next_step.finished.append(seq)

    def has_work(self) -> bool:
        return True

    def step(self) -> StepResult:
        result, self.next_step = self.next_step, StepResult()
        return result

    def kv_stats(self) -> KVStats:
        return KVStats(16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


@pytest.fixture
def workspace(tmp_path):
    shutil.copytree(EXAMPLE_WORKSPACE, tmp_path / "ws")
    return Workspace(tmp_path / "ws")


@pytest.fixture
def spec(tmp_path):
    return load_spec(write_run_spec(tmp_path / "spec", tmp_path / "no-model-needed", agents=[{"name": "a1"}]),
                     check_model=False)


def make_agent(workspace, events, max_turns=5, max_tokens=10_000, max_context=100_000):
    toolbox = ToolBox(workspace, ["list_dir", "read_file", "write_file"])
    return Agent("a1", toolbox, SamplingParams(max_tokens=64, stop=["</tool_call>"]),
                 AgentLimits(max_turns=max_turns, max_tokens=max_tokens, max_context=max_context), events.append,
                 prompt_tokens=len(tiny_tokenizer().encode(PROMPT)))


def start(spec, engine: FakeEngine, agent: Agent) -> AgentLoop:
    """The run's loop on the local backend, with the agent's first turn sent."""
    backend = LocalBackend(spec, engine)
    backend.add_agent(agent.name, engine.tokenizer.encode(PROMPT))
    loop = AgentLoop(backend, [agent])
    agent.start([])
    loop.begin(agent)
    return loop


def generate(loop: AgentLoop, agent: Agent, text: str, eos: bool = True, reason: str | None = "stop"):
    """Plays the model for the agent's turn: one engine step, dispatched; the tool work it asks for."""
    loop.backend.engine.play(seq_of(loop, agent), text, eos, reason)
    jobs = [job for _, job in loop.dispatch(loop.backend.poll(0), 0.0)]
    return jobs[0] if jobs else None


def seq_of(loop: AgentLoop, agent: Agent) -> Sequence:
    return loop.backend.sequence(agent.name)


def kinds(events):
    return [event.kind for event in events]


def test_tool_call_runs_and_its_result_is_appended_in_the_chat_format(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    loop = start(spec, engine, agent)
    seq = seq_of(loop, agent)
    assert agent.state is AgentState.PREFILL
    job = generate(loop, agent, READ_README, eos=False)
    assert agent.state is AgentState.TOOL and [c.name for c in job.calls] == ["read_file"]
    loop.resume(agent, job.run(agent.toolbox))
    appended = engine.tokenizer.decode(engine.extended[0], skip_special_tokens=False)
    assert appended.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n   1 | # textkit")
    assert appended.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert agent.state is AgentState.PREFILL and agent.last_tool == "read_file"
    generate(loop, agent, "The README describes textkit.")
    assert agent.state is AgentState.DONE and agent.end_reason == "final_answer"
    assert kinds(events) == ["prefilled", "assistant", "tool_call", "tool_result", "prefilled", "assistant", "end"]
    assert engine.released == [seq] and agent.turn == 2 and agent.tool_calls == 1


def test_history_is_append_only(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    loop = start(spec, engine, agent)
    seq = seq_of(loop, agent)
    before = list(seq.token_ids)
    job = generate(loop, agent, READ_README, eos=False)
    after_turn = list(seq.token_ids)
    loop.resume(agent, job.run(agent.toolbox))
    assert seq.token_ids[:len(before)] == before
    assert seq.token_ids[:len(after_turn)] == after_turn
    assert seq.token_ids == after_turn + engine.extended[0]
    assert agent.context_tokens == len(seq)  # the agent counts what the sequence holds


def test_malformed_call_returns_an_error_to_the_agent_and_the_run_goes_on(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    loop = start(spec, engine, agent)
    job = generate(loop, agent, '<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>', eos=False)
    assert job.calls == [] and job.errors
    loop.resume(agent, job.run(agent.toolbox))
    appended = engine.tokenizer.decode(engine.extended[0], skip_special_tokens=False)
    assert "was not run" in appended and "valid JSON" in appended
    assert agent.state is AgentState.PREFILL and kinds(events)[-1] == "tool_error"


@pytest.mark.parametrize("call, message", [
    ('{"name": "delete_everything", "arguments": {}}', "unknown tool"),
    ('{"name": "read_file", "arguments": {"file": "a"}}', "has no argument"),
    ('{"name": "read_file", "arguments": {"path": "../../etc/passwd"}}', "leaves the workspace"),
    ('{"name": "read_file", "arguments": {"path": "/etc/passwd"}}', "absolute"),
])
def test_bad_calls_and_escapes_come_back_as_error_results(spec, workspace, call, message):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    loop = start(spec, engine, agent)
    job = generate(loop, agent, call)  # the bare JSON form small models write
    loop.resume(agent, job.run(agent.toolbox))
    result = [e for e in events if e.kind == "tool_result"][0]
    assert not result.data["ok"] and message in result.data["output"]
    assert agent.state is AgentState.PREFILL


def test_write_file_changes_only_the_agents_workspace(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    loop = start(spec, engine, agent)
    call = '<tool_call>{"name": "write_file", "arguments": {"path": "notes.txt", "content": "hi"}}</tool_call>'
    loop.resume(agent, generate(loop, agent, call, eos=False).run(agent.toolbox))
    assert (workspace.root / "notes.txt").read_text() == "hi"
    assert not (EXAMPLE_WORKSPACE / "notes.txt").exists()


def test_turn_limit_ends_the_agent(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events, max_turns=2)
    loop = start(spec, engine, agent)
    loop.resume(agent, generate(loop, agent, READ_README, eos=False).run(agent.toolbox))
    assert generate(loop, agent, READ_README, eos=False) is None
    assert agent.state is AgentState.DONE and agent.end_reason == "max_turns" and agent.turn == 2


def test_token_limit_ends_the_agent_and_caps_each_turn(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events, max_tokens=40)
    loop = start(spec, engine, agent)
    assert seq_of(loop, agent).params.max_tokens == 40
    generate(loop, agent, READ_README + "x" * 40, eos=False, reason="length")
    assert agent.end_reason == "max_tokens"


def test_a_turn_cut_at_sampling_max_tokens_is_not_a_final_answer(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    loop = start(spec, engine, agent)
    assert generate(loop, agent, "I will start by reading", eos=False, reason="length") is None
    assert agent.state is AgentState.DONE and agent.end_reason == "length" and agent.turn == 1
    assert events[-1].data["reason"] == "length"


def test_a_turn_cut_by_the_agents_token_limit_or_the_context_says_which(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events, max_tokens=5)
    loop = start(spec, engine, agent)
    generate(loop, agent, "x" * 40, eos=False, reason="length")
    assert agent.end_reason == "max_tokens"

    agent = make_agent(workspace, events, max_context=50)  # the prompt is 22 tokens
    loop = start(spec, engine, agent)
    assert seq_of(loop, agent).params.max_tokens == 28
    generate(loop, agent, "x" * 28, eos=False, reason="length")
    assert agent.end_reason == "context_full"


def test_context_full_ends_the_agent_before_appending(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events, max_context=120)
    loop = start(spec, engine, agent)
    loop.resume(agent, generate(loop, agent, READ_README, eos=False).run(agent.toolbox))
    assert agent.end_reason == "context_full" and engine.extended == []


def test_a_prompt_longer_than_the_context_fails_the_agent_before_it_is_sent(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events, max_context=22)  # the prompt is 22 tokens
    loop = start(spec, engine, agent)
    assert seq_of(loop, agent) is None and loop.done
    assert (agent.state, agent.end_reason) == (AgentState.ERROR, "context_full")
    assert agent.error.startswith("the prompt has 22 tokens, the model's context is 22")


def test_stop_keeps_the_partial_turn_in_the_transcript(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    loop = start(spec, engine, agent)
    generate(loop, agent, "I will read", eos=False, reason=None)
    loop.stop_agents("interrupted")
    assert agent.state is AgentState.INTERRUPTED
    partial, end = events[-2], events[-1]
    assert partial.kind == "assistant" and partial.data["partial"] and partial.data["content"] == "I will read"
    assert end.kind == "end" and end.data["reason"] == "interrupted"
    assert agent.turn == partial.data["turn"] == end.data["turns"] == 1  # the cut turn counts


def test_wall_time_ends_the_agent_mid_turn_and_counts_that_turn(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    loop = start(spec, engine, agent)
    loop.resume(agent, generate(loop, agent, READ_README, eos=False).run(agent.toolbox))
    generate(loop, agent, "The README", eos=False, reason=None)
    loop.stop_agents("wall_time")
    assert (agent.state, agent.end_reason, agent.turn) == (AgentState.DONE, "wall_time", 2)
    assert events[-2].data["turn"] == 2 and events[-2].data["finish_reason"] == "wall_time"


def test_results_arriving_after_the_agent_ended_are_dropped(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    loop = start(spec, engine, agent)
    job = generate(loop, agent, READ_README, eos=False)
    loop.stop_agents("wall_time")
    loop.resume(agent, job.run(agent.toolbox))
    assert engine.extended == [] and agent.end_reason == "wall_time"


def test_engine_error_ends_the_agent_with_its_message(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    loop = start(spec, engine, agent)
    seq = seq_of(loop, agent)
    engine.fail(seq, "needs more KV than the pool holds")
    assert loop.dispatch(loop.backend.poll(0), 0.0) == []
    assert agent.state is AgentState.ERROR and "more KV" in agent.error
    assert engine.released == [seq]


def test_a_turn_waiting_for_the_scheduler_shows_as_queued(spec, workspace):
    engine, events = FakeEngine(), []
    agent = make_agent(workspace, events)
    loop = start(spec, engine, agent)
    assert agent.state is AgentState.PREFILL and agent.display_state is AgentState.QUEUED  # nothing computed
    seq_of(loop, agent).num_computed_tokens = 16  # admitted: its first chunk is computed
    loop.dispatch(loop.backend.poll(0), 0.0)
    assert agent.display_state is AgentState.PREFILL
