"""`swarm run` as a user runs it: a subprocess on a tiny random model."""
import json
import os
import subprocess
import sys

import pytest

from swarm.transcript import read_transcript
from tests.swarm.run_helpers import REPO, interrupt_once_decoding, tiny_model, write_run_spec

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def swarm(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "swarm", *map(str, args)], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.getbasetemp())


def run_dirs(folder):
    return sorted(p for p in (folder / "runs").iterdir() if p.is_dir())


def test_json_run_writes_transcripts_and_summary(tmp_path, model):
    spec = write_run_spec(tmp_path, model, agents=2, max_tokens=24)
    process = swarm("run", spec, "--json")
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    summary = json.loads(stdout)
    [run_dir] = run_dirs(tmp_path)
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert summary["status"] == "completed" and summary["run_dir"] == str(run_dir)
    assert "agent-1" in stderr and "prefilled" in stderr  # progress lines went to stderr
    for agent in summary["agents"]:
        events = read_transcript(run_dir / agent["transcript"])
        assert [e["event"] for e in events[:3]] == ["message", "message", "prefilled"]
        assert events[-1]["event"] == "end" and events[-1]["status"] == agent["status"] == "done"
        assert agent["end_reason"] in ("final_answer", "max_tokens", "max_turns")
        assert agent["generated_tokens"] == sum(e["tokens"] for e in events if e["event"] == "assistant")
        assert (run_dir / "workspaces" / agent["name"] / "README.md").exists()
    memory = summary["memory"]
    assert memory["trunk_tokens"] > 0 and memory["bytes_saved"] > 0 and memory["peak"]["agents_sharing"] == 2


# `swarm run` with every engine step 10 ms slower, so a tiny model's run lasts long enough to interrupt.
SLOW_SWARM = """
import sys, time
from engine.llm_engine import LLMEngine
step = LLMEngine.step
LLMEngine.step = lambda self: time.sleep(0.01) or step(self)
sys.argv[0] = "swarm"
from swarm.cli import main
main()
"""


def test_sigint_stops_cleanly_with_exit_code_130(tmp_path, model):
    spec = write_run_spec(tmp_path, model, agents=2, max_tokens=1000, max_turns=30, temperature=0)
    code, stdout, stderr = interrupt_once_decoding(["-c", SLOW_SWARM, "run", str(spec), "--no-tui"], ENV)
    assert code == 130, stderr
    [run_dir] = run_dirs(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    for agent in summary["agents"]:
        assert agent["status"] == "interrupted" and agent["end_reason"] == "interrupted"
        events = read_transcript(run_dir / agent["transcript"])  # every line is whole JSON
        assert events[-1]["event"] == "end" and events[-1]["reason"] == "interrupted"
        partial = [e for e in events if e["event"] == "assistant"]
        assert partial and partial[-1]["partial"] and partial[-1]["tokens"] > 0
    assert "interrupted" in stdout


def test_spec_mistake_is_one_line_and_exit_code_2(tmp_path):
    spec = tmp_path / "swarm.yaml"
    spec.write_text("model: smollm2-135m-instruct\nagents: 2\ntask: x\nlimits: {max_turn: 3}\n")
    process = swarm("run", spec)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert stderr.strip().count("\n") == 0 and "max_turn" in stderr and "did you mean" in stderr
