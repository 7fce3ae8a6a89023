"""`swarm run` as a user runs it: a subprocess on a tiny random model."""
import json
import signal
import subprocess
import sys

import pytest

from tests.helpers.runs import (
    ENV,
    EXAMPLE_WORKSPACE,
    REPO,
    interrupt_once_decoding,
    read_transcript,
    swarm,
    tiny_model,
    write_run_spec,
)
from tests.helpers.spec_files import alias_bomb_tool


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.getbasetemp())


def run_dirs(folder):
    return sorted(p for p in (folder / "runs").iterdir() if p.is_dir())


def test_json_run_writes_transcripts_and_summary(tmp_path, model):
    # greedy: both agents' turns last as long whatever a sampler draws, so their KV overlaps
    spec = write_run_spec(tmp_path, model, agents=2, max_tokens=24, temperature=0.0)
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
        assert agent["end_reason"] in ("final_answer", "length", "max_tokens", "max_turns")
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
from swarm.cli.main import main
main()
"""


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_cleanly_with_its_exit_code(tmp_path, model, sig, code):
    """Ctrl-C, or SIGTERM as `docker stop`, systemd and CI timeouts send it."""
    spec = write_run_spec(tmp_path, model, agents=2, max_tokens=1000, max_turns=30, temperature=0)
    code_seen, stdout, stderr = interrupt_once_decoding(["-c", SLOW_SWARM, "run", str(spec), "--no-tui"], ENV,
                                                        sig=sig)
    assert code_seen == code, stderr
    assert "Traceback" not in stderr
    [run_dir] = run_dirs(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    for agent in summary["agents"]:
        assert agent["status"] == "interrupted" and agent["end_reason"] == "interrupted"
        events = read_transcript(run_dir / agent["transcript"])  # every line is whole JSON
        assert events[-1]["event"] == "end" and events[-1]["reason"] == "interrupted"
        turns = [e for e in events if e["event"] == "assistant"]
        assert turns and turns[-1]["partial"] and turns[-1]["tokens"] > 0
        assert agent["turns"] == events[-1]["turns"] == len(turns)  # the partial turn counts
    assert "interrupted" in stdout


# `swarm run` whose engine, once the agents decode, takes a step that never ends: only a second
# signal can stop it. It says when it is stuck, and when the first signal has been handled.
STUCK_SWARM = """
import signal, sys, time
from engine.llm_engine import LLMEngine
step = LLMEngine.step

def step_until_stuck(self):
    result = step(self)
    if any(seq.num_output_tokens for seq in self.live.values() if seq.request_id != "(trunk)"):
        handler = signal.getsignal(signal.SIGTERM)
        if callable(handler):
            signal.signal(signal.SIGTERM, lambda *a: handler(*a) or print("signal handled", flush=True))
        print("stuck in a step", flush=True)
        while True:
            time.sleep(0.01)
    return result

LLMEngine.step = step_until_stuck
sys.argv[0] = "swarm"
from swarm.cli.main import main
main()
"""


def test_a_second_sigterm_stops_at_once_and_still_writes_the_results(tmp_path, model):
    spec = write_run_spec(tmp_path, model, agents=2, max_tokens=1000, max_turns=30, temperature=0)
    process = subprocess.Popen([sys.executable, "-c", STUCK_SWARM, "run", str(spec), "--no-tui"], cwd=REPO, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_line(process, "stuck in a step")
        process.send_signal(signal.SIGTERM)
        assert wait_for_line(process, "signal handled")  # the run would stop at the next step: there is none
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    [run_dir] = run_dirs(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    for agent in summary["agents"]:
        assert agent["end_reason"] == "interrupted"
        events = read_transcript(run_dir / agent["transcript"])
        assert events[-1]["event"] == "end" and events[-1]["reason"] == "interrupted"


def wait_for_line(process: subprocess.Popen, text: str) -> bool:
    return any(text in line for line in process.stdout)


def test_a_turn_cut_at_sampling_max_tokens_ends_with_length(tmp_path, model):
    spec = write_run_spec(tmp_path, model, agents=2, max_tokens=2, temperature=0)
    process = swarm("run", spec, "--json")
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["status"] == "completed"
    [run_dir] = run_dirs(tmp_path)
    for agent in summary["agents"]:
        assert (agent["status"], agent["end_reason"], agent["turns"]) == ("done", "length", 1)
        events = read_transcript(run_dir / agent["transcript"])
        [turn] = [e for e in events if e["event"] == "assistant"]
        assert turn["finish_reason"] == "length" and turn["tokens"] == 2
        assert events[-1]["event"] == "end" and events[-1]["reason"] == "length"


# `swarm run` whose clock, once every agent has its first token, jumps past the wall time: the
# run must then stop the agents mid-turn. The wall time is an hour, so no machine reaches it by
# being slow, and nothing waits for it either.
WALL_TIME = 3600
JUMP_PAST_THE_WALL_TIME = """
import sys
from engine.llm_engine import LLMEngine
from swarm.run.phases import SwarmRun
step, init, jump = LLMEngine.step, SwarmRun.__init__, [0.0]

def init_with_a_clock_that_jumps(self, *args, **kwargs):
    init(self, *args, **kwargs)
    clock = self.clock
    self.clock = lambda: clock() + jump[0]

def step_then_jump_past_the_wall_time(self):
    result = step(self)
    agents = [seq for seq in self.live.values() if seq.request_id != "(trunk)"]
    if not jump[0] and len(agents) == 2 and all(seq.num_output_tokens for seq in agents):
        jump[0] = %d + 1
    return result

SwarmRun.__init__ = init_with_a_clock_that_jumps
LLMEngine.step = step_then_jump_past_the_wall_time
sys.argv[0] = "swarm"
from swarm.cli.main import main
main()
""" % WALL_TIME


def test_wall_time_counts_the_cut_turn_and_the_run_says_wall_time(tmp_path, model):
    spec = write_run_spec(tmp_path, model, agents=2, max_tokens=1000, max_turns=30, temperature=0,
                          wall_time=WALL_TIME)
    process = subprocess.run([sys.executable, "-c", JUMP_PAST_THE_WALL_TIME, "run", str(spec), "--json"], cwd=REPO,
                             env=ENV, capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr
    summary = json.loads(process.stdout)
    assert summary["status"] == "wall_time"
    [run_dir] = run_dirs(tmp_path)
    for agent in summary["agents"]:
        assert (agent["status"], agent["end_reason"], agent["turns"]) == ("done", "wall_time", 1)
        events = read_transcript(run_dir / agent["transcript"])
        [turn] = [e for e in events if e["event"] == "assistant"]
        assert turn["partial"] and turn["turn"] == 1 and turn["tokens"] == agent["generated_tokens"] > 0
        assert events[-1]["event"] == "end" and (events[-1]["reason"], events[-1]["turns"]) == ("wall_time", 1)
        assert agent["peak_private_bytes"] > 0 and agent["shared_bytes"] > 0
    assert "swarm: wall_time:" in process.stderr


def test_spec_mistake_is_one_line_and_exit_code_2(tmp_path):
    spec = tmp_path / "swarm.yaml"
    spec.write_text("model: smollm2-135m-instruct\nagents: 2\ntask: x\nlimits: {max_turn: 3}\n")
    process = swarm("run", spec)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert stderr.strip().count("\n") == 0 and "max_turn" in stderr and "did you mean" in stderr


def no_workspace(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if "workspace" not in line and "mode: copy" not in line)


# Each: how to change write_run_spec's spec, and the line, key and words of the one error line.
SPEC_ERRORS = {
    "missing workspace": (lambda t: t.replace(str(EXAMPLE_WORKSPACE), "no-such-project"), 9, "workspace.path",
                          "no folder"),
    "tool named like the harness's": (lambda t: t + "extra_tools:\n  - {name: read_file}\n", 22,
                                      "extra_tools[0]", "the harness already has a tool named 'read_file'"),
    "two extra tools of one name": (lambda t: t + "extra_tools:\n  - {name: ticket}\n  - {name: ticket}\n", 23,
                                    "extra_tools[1]", "extra_tools[0] is already named 'ticket'"),
    "shared-readonly with run_command": (
        lambda t: t.replace("mode: copy", "mode: shared-readonly").replace("enabled: false", "enabled: true")
                   .replace("tiny-harness.json", "coding-agent"), 10, "workspace.mode", "run_command"),
    "kv_budget too small for the trunk": (lambda t: t.replace("kv_budget: 16000", "kv_budget: 100KB"), 4,
                                          "kv_budget", "give at least"),
    "out naming a file": (lambda t: t.replace("out: runs", "out: swarm.yaml"), 20, "out", "is a file"),
    "out inside the copied workspace": (no_workspace, 17, "out", "lies inside the workspace"),
    "temperature NaN": (lambda t: t.replace("temperature: 1.0", "temperature: NaN"), 12, "sampling.temperature",
                        "expected a finite number, got 'NaN'"),
    "alias bomb": (lambda t: t + alias_bomb_tool(), 31, "extra_tools[0].parameters.properties.l5",
                   "expands to more than 100,000 values through YAML aliases"),
}


@pytest.mark.parametrize("case", SPEC_ERRORS)
def test_a_spec_error_is_one_line_naming_file_and_line_and_leaves_no_run_folder(tmp_path, model, case):
    change, line, key, words = SPEC_ERRORS[case]
    spec = write_run_spec(tmp_path, model, agents=2)
    spec.write_text(change(spec.read_text()))
    before = sorted(tmp_path.rglob("*"))
    result = subprocess.run([sys.executable, "-m", "swarm", "run", str(spec)], cwd=REPO, env=ENV,
                            capture_output=True, text=True, timeout=120)  # the bomb would run for hours
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    [message] = result.stderr.splitlines()
    assert message.startswith(f"error: {spec}:{line}: {key}: ") and words in message, message
    assert sorted(tmp_path.rglob("*")) == before  # no run folder, no runs/ either
