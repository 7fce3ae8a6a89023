"""A whole run in process, on the real engine with a tiny random model. A scripted sampler makes
the agents call tools, so the turns, the appended tool results and the KV sharing are real."""
import math
import threading
import time

import pytest
import torch

from engine.llm_engine import EngineOptions, LLMEngine
from swarm.agents.agent import ToolJob
from swarm.agents.command_runner import run_supervised
from swarm.cli.plain_view import PlainView
from swarm.run.local_backend import LocalBackend
from swarm.run.memory import TRUNK_REQUEST_ID, MemorySnapshot, RunMemory
from swarm.run.phases import SwarmRun, run_phases
from swarm.run.stop_flag import StopFlag
from swarm.spec.schema import load_spec
from tests.helpers.processes import is_running, wait_for_pids
from tests.helpers.runs import READER_EVENTS, ScriptedSampler, read_transcript, tiny_model, write_run_spec

SCRIPTS = {
    "reader": ['<tool_call>{"name": "read_file", "arguments": {"path": "textkit/temperature.py"}}</tool_call>',
               '<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>',
               '<tool_call>{"name": "write_file", "arguments": {"path": "textkit/temperature.py", '
               '"content": "FIXED"}}</tool_call>',
               "Fixed the formula in textkit/temperature.py."],
    "escaper": ['{"name": "read_file", "arguments": {"path": "../../../etc/passwd"}}', "I cannot."],
    "quick": ["Nothing to do."],
}


class RecordingMemory(RunMemory):
    """Keeps every KVStats the run read, with the snapshot it made of it."""

    def observe_engine(self, stats):
        snapshot = super().observe_engine(stats)
        self.__dict__.setdefault("observed", []).append((stats, snapshot))
        return snapshot


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scripted")
    model = tiny_model(tmp_path_factory.getbasetemp())
    spec = load_spec(write_run_spec(folder, model, agents=[{"name": name} for name in SCRIPTS], max_tokens=200))
    engine = LLMEngine(str(model), EngineOptions(device="cpu", dtype="float32", kv_budget_tokens=16000))
    engine.sampler = ScriptedSampler(engine, SCRIPTS)
    run_dir = folder / "runs" / "scripted"
    run_dir.mkdir(parents=True)
    backend = LocalBackend(spec, engine)
    backend.memory = RecordingMemory(MemorySnapshot(), list(SCRIPTS))
    run = SwarmRun(spec, run_dir, PlainView(open(folder / "log.txt", "w")), backend=backend)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model gains nothing from threads, and a shared CPU punishes them
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ToolJob, "run", slow_escaper_tool(run_dir / "agent-reader.jsonl"))
            summary = run.run()
    finally:
        torch.set_num_threads(threads)
    return run, summary, run.memory.observed


def slow_escaper_tool(reader_transcript):
    """The escaper's tool call returns only once the reader has finished a turn: that can only
    happen if the loop keeps decoding the others while a tool runs."""
    original = ToolJob.run

    def run(job, toolbox):
        if "escaper" in str(toolbox.workspace.root):
            deadline = time.monotonic() + 60
            while '"assistant"' not in reader_transcript.read_text() and time.monotonic() < deadline:
                time.sleep(0.02)
        return original(job, toolbox)

    return run


def events_of(run, name):
    return read_transcript(run.info.run_dir / f"agent-{name}.jsonl")


def test_every_agent_ends_with_its_reason(scripted_run):
    run, summary, _ = scripted_run
    assert summary["status"] == "completed"
    agents = {a["name"]: a for a in summary["agents"]}
    assert {name: (a["status"], a["end_reason"], a["turns"]) for name, a in agents.items()} == {
        "reader": ("done", "final_answer", 4), "escaper": ("done", "final_answer", 2),
        "quick": ("done", "final_answer", 1)}
    assert agents["reader"]["tool_calls"] == 2  # the malformed call ran nothing


def test_transcript_records_messages_calls_results_and_token_counts(scripted_run):
    run, _, _ = scripted_run
    events = events_of(run, "reader")
    assert [e["event"] for e in events] == READER_EVENTS
    assert events[0]["role"] == "system" and events[1]["role"] == "user"
    assert "Fix the failing test" in events[1]["content"]
    assert "+ 23" in events[5]["output"] and events[5]["ok"]
    assert events[12]["ok"] and events[12]["output"].startswith("wrote")
    assert events[6]["context_tokens"] == events[3]["context_tokens"] + events[5]["appended_tokens"]
    assert all(e["tokens"] > 0 for e in events if e["event"] == "assistant")
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)
    escaper = events_of(run, "escaper")
    refused = [e for e in escaper if e["event"] == "tool_result"][0]
    assert not refused["ok"] and "leaves the workspace" in refused["output"]


def test_tool_results_are_appended_to_the_same_sequence_in_chat_format(scripted_run):
    run, _, _ = scripted_run
    reader = run.backend.sequence("reader")
    tokenizer = run.backend.engine.tokenizer
    text = tokenizer.decode(reader.token_ids, skip_special_tokens=False)
    system = run.backend.prompts.agents[0]
    assert reader.token_ids[:len(run.backend.prompts.trunk.token_ids)] == run.backend.prompts.trunk.token_ids
    assert text.startswith(tokenizer.decode(system.prompt_ids, skip_special_tokens=False))
    assert text.count("<|im_start|>user\n<tool_response>\n") == 3
    assert text.endswith("Fixed the formula in textkit/temperature.py.<|im_end|>")


def test_a_tool_wait_does_not_hold_back_the_other_agents(scripted_run):
    run, _, _ = scripted_run
    escaper = events_of(run, "escaper")
    call = next(e for e in escaper if e["event"] == "tool_call")
    result = next(e for e in escaper if e["event"] == "tool_result")
    reader_turn = next(e for e in events_of(run, "reader") if e["event"] == "assistant")
    assert call["t"] < reader_turn["t"] <= result["t"]


def test_each_agent_works_in_its_own_copy(scripted_run):
    run, summary, _ = scripted_run
    reader = next(a for a in summary["agents"] if a["name"] == "reader")
    quick = next(a for a in summary["agents"] if a["name"] == "quick")
    assert (run.info.run_dir / "workspaces" / "reader" / "textkit" / "temperature.py").read_text() == "FIXED"
    assert "+ 23" in (run.info.run_dir / "workspaces" / "quick" / "textkit" / "temperature.py").read_text()
    assert reader["workspace"] != quick["workspace"]


def test_memory_figures_add_up_against_the_engines_accounting(scripted_run):
    run, summary, observed = scripted_run
    memory = summary["memory"]
    block_bytes, block_size = memory["block_bytes"], memory["block_size"]
    trunk_tokens = len(run.backend.prompts.trunk.token_ids)
    assert memory["trunk_tokens"] == trunk_tokens
    assert memory["trunk_blocks"] == math.ceil(trunk_tokens / block_size)
    assert memory["trunk_bytes"] == memory["trunk_blocks"] * block_bytes
    for stats, snapshot in observed:
        agents = [r for r in stats.requests if r.request_id in SCRIPTS]
        everyone_private = sum(r.private_bytes for r in stats.requests)
        assert stats.used_bytes == stats.blocks_shared * block_bytes + everyone_private + snapshot.pinned_only_bytes
        assert snapshot.pinned_only_bytes == 0  # nothing was evicted in this run
        assert snapshot.shared_bytes == stats.blocks_shared * block_bytes
        assert snapshot.private_bytes == sum(r.private_bytes for r in agents)
        assert snapshot.bytes_saved == sum(r.shared_bytes for r in agents) - snapshot.shared_bytes
        assert snapshot.bytes_without_sharing - snapshot.bytes_saved == snapshot.shared_bytes + snapshot.private_bytes
    peak = memory["peak"]
    full_trunk_blocks = trunk_tokens // block_size
    assert peak["agents_sharing"] == 3
    assert peak["bytes_saved"] >= 2 * full_trunk_blocks * block_bytes  # 3 agents, one copy of the trunk
    assert memory["bytes_saved"] == peak["bytes_saved"] == max(s.bytes_saved for _, s in observed)
    assert peak["used_bytes"] == (peak["shared_bytes"] + peak["private_bytes"] + peak["trunk_private_bytes"]
                                  + peak["pinned_only_bytes"])
    assert memory["peak_private_bytes"] == max(s.private_bytes for _, s in observed)
    for agent in summary["agents"]:
        assert agent["shared_bytes"] >= full_trunk_blocks * block_bytes
        assert agent["peak_private_bytes"] > 0


def test_trunk_is_computed_once(scripted_run):
    run, summary, observed = scripted_run
    trunk_tokens = summary["memory"]["trunk_tokens"]
    last_stats = observed[-1][0]
    assert [r.request_id for r in last_stats.requests] == [TRUNK_REQUEST_ID]  # agents gave their KV back
    contexts = sum(a["context_tokens"] for a in summary["agents"])
    # every token computed once, except each agent's copy of the trunk's partly filled last block
    assert last_stats.tokens_computed <= trunk_tokens + contexts - 3 * (trunk_tokens // 16 * 16)


def test_the_runs_end_stops_the_commands_its_tools_still_run_before_it_finishes(tmp_path):
    results = []
    call = threading.Thread(target=lambda: results.append(run_supervised(
        "sleep 300 & echo $! > pids; sleep 301", tmp_path, timeout=120)))
    call.start()
    pids = wait_for_pids(tmp_path / "pids")
    finished = []

    def interrupted():
        raise KeyboardInterrupt

    run_phases([interrupted], lambda status, error: finished.append((status, [is_running(p) for p in pids])),
               StopFlag())
    call.join(30)
    assert finished == [("interrupted", [False])]
    assert not call.is_alive() and results[0].ending == "stopped"
