import json

from swarm.agents.agent import AgentEvent
from swarm.run.summary import SUMMARY_FILE, write_summary
from swarm.run.transcript import TranscriptWriter, transcript_path
from tests.helpers.runs import read_transcript


def test_each_event_is_on_disk_as_soon_as_it_is_written(tmp_path):
    writer = TranscriptWriter(tmp_path, start_time=100.0)
    writer.write(AgentEvent("a1", "tool_call", {"turn": 1, "name": "read_file", "arguments": {"path": "é.py"}}, 101.5))
    assert read_transcript(transcript_path(tmp_path, "a1")) == [
        {"t": 1.5, "event": "tool_call", "turn": 1, "name": "read_file", "arguments": {"path": "é.py"}}]
    writer.write(AgentEvent("a1", "end", {"status": "done"}, 102.0))
    writer.write(AgentEvent("b2", "end", {"status": "error"}, 102.0))
    assert [e["event"] for e in read_transcript(tmp_path / "agent-a1.jsonl")] == ["tool_call", "end"]
    assert read_transcript(tmp_path / "agent-b2.jsonl")[0]["status"] == "error"
    writer.close()


def test_a_reopened_transcript_is_appended_to(tmp_path):
    for time in (1.0, 2.0):
        writer = TranscriptWriter(tmp_path, start_time=0.0)
        writer.write(AgentEvent("a", "prefilled", {}, time))
        writer.close()
    assert [e["t"] for e in read_transcript(tmp_path / "agent-a.jsonl")] == [1.0, 2.0]


def test_summary_is_replaced_atomically(tmp_path):
    write_summary(tmp_path, {"status": "running"})
    path = write_summary(tmp_path, {"status": "interrupted", "agents": []})
    assert path == tmp_path / SUMMARY_FILE
    assert json.loads(path.read_text()) == {"status": "interrupted", "agents": []}
    assert [p.name for p in tmp_path.iterdir()] == [SUMMARY_FILE]  # no temporary file left behind
