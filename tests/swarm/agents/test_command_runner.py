"""run_command's processes: none outlives its call, its timeout or swarm, and output is bounded.

Every test runs real shells and real processes. A command writes the pids of what it starts
(`echo $!`) into a file; the assertion is that those processes are gone afterwards. Time bounds
only guard against a hang (HANG_GUARD), they never measure speed.
"""
import json
import os
import signal
import subprocess
import threading

import pytest

from swarm.agents.command_runner import kill_running_commands, run_supervised
from swarm.agents.tool_calls import ToolCall
from swarm.agents.tools import ToolBox
from swarm.agents.workspace import Workspace
from tests.helpers.processes import (
    PYTHON,
    call_with_guard,
    is_running,
    kill_leftover_sleeps,
    peak_growth_of_tool_call,
    python_child_env,
    wait_for,
    wait_for_pids,
)


def run_command(root, command, timeout, **box_options):
    box = ToolBox(Workspace(root), allow_commands=True, **box_options)
    return call_with_guard(lambda: box.run(ToolCall("run_command", {"command": command, "timeout": timeout}, raw="")))


@pytest.fixture
def started(tmp_path):
    """The pids file the commands write, and a clean-up of its pids should a test fail."""
    pids = tmp_path / "pids"
    yield pids
    if pids.exists():
        kill_leftover_sleeps([int(word) for word in pids.read_text().split()])


def test_a_setsid_child_does_not_hold_the_call_past_its_timeout(tmp_path, started):
    result = run_command(tmp_path, "setsid sleep 300 & echo $! > pids; sleep 100", timeout=2)
    assert not result.ok and "timed out after 2 s" in result.output
    assert not any(is_running(pid) for pid in wait_for_pids(started))


@pytest.mark.parametrize("command", [
    "sleep 300 >/dev/null 2>&1 & echo $! > pids",
    "sleep 300 & echo $! > pids",  # holds the output pipe open
    ("nohup setsid sh -c 'sleep 300 & echo $! > pids; sleep 300' >/dev/null 2>&1 & "
     "while [ ! -s pids ]; do sleep 0.01; done"),
    "(setsid sleep 300 & echo $! > pids) & while [ ! -s pids ]; do sleep 0.01; done",  # a double fork
])
def test_background_processes_are_killed_when_the_command_ends(tmp_path, started, command):
    result = run_command(tmp_path, command, timeout=60)
    assert result.ok and result.output.startswith("exit code: 0")
    assert "were still running when the command ended and were killed" in result.output
    assert not any(is_running(pid) for pid in wait_for_pids(started))


def test_a_process_outside_the_tree_holding_the_output_pipe_cannot_hold_the_call(tmp_path):
    # an unrelated process takes the shell's stdout through /proc; it is no descendant to kill
    holder = subprocess.Popen([PYTHON, "-c", HOLD_THE_PIPE, str(tmp_path)])
    try:
        command = "echo $$ > shell_pid; while [ ! -e held ]; do sleep 0.01; done; echo bye"
        result = run_command(tmp_path, command, timeout=60)
        assert result.ok and "bye" in result.output and holder.poll() is None
    finally:
        holder.kill()
        holder.wait()


HOLD_THE_PIPE = """
import os, sys, time
root = sys.argv[1]
while not os.path.exists(f"{root}/shell_pid") or not open(f"{root}/shell_pid").read().strip():
    time.sleep(0.01)
pipe = open(f"/proc/{open(f'{root}/shell_pid').read().strip()}/fd/1", "wb")
open(f"{root}/held", "w").close()
time.sleep(300)
"""


def test_kill_running_commands_stops_the_calls_in_flight_with_their_processes(tmp_path, started):
    results = []
    call = threading.Thread(target=lambda: results.append(run_supervised(
        "sleep 300 & echo $! > pids; setsid sleep 301 & echo $! >> pids; sleep 302", tmp_path, timeout=120)))
    call.start()
    pids = wait_for_pids(started, count=2)
    assert kill_running_commands() == 1
    call.join(30)
    assert not call.is_alive() and results[0].ending == "stopped"
    assert not any(is_running(pid) for pid in pids)


# The run's end, as a Ctrl-C at a terminal (SIGINT to the foreground group) or a SIGKILL.
_SWARM_IN_A_TOOL_CALL = """
import signal, sys
from swarm.agents.tools import run_command
signal.signal(signal.SIGINT, signal.default_int_handler)   # a shell's background job starts with SIGINT ignored
from swarm.agents.workspace import Workspace
run_command(Workspace(sys.argv[1]), "sleep 300 & echo $! > pids; setsid sleep 301 & echo $! >> pids; sleep 302", 120)
"""


@pytest.mark.parametrize("ending", ["ctrl-c", "sigkill"])
def test_no_process_of_a_tool_call_outlives_swarm(tmp_path, started, ending):
    swarm = subprocess.Popen([PYTHON, "-c", _SWARM_IN_A_TOOL_CALL, str(tmp_path)], env=python_child_env(),
                             start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        pids = wait_for_pids(started, count=2)
        if ending == "ctrl-c":
            os.killpg(swarm.pid, signal.SIGINT)
        else:
            swarm.kill()
        swarm.wait(30)
        assert wait_for(lambda: not any(is_running(pid) for pid in pids)), "a tool's process outlived swarm"
    finally:
        swarm.kill()


_HUGE_OUTPUT_PEAK = """
import json, resource, sys
from swarm.agents.command_runner import run_supervised
result = run_supervised("head -c 100000000 /dev/zero | tr '\\\\0' x; echo; echo end", sys.argv[1], 120)
children_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"children_mb": children_mb, "stdout_chars": len(result.stdout), "tail": result.stdout[-10:]}))
"""


def test_the_supervisor_holds_a_bounded_part_of_a_huge_output(tmp_path):
    # a small parent (no torch), so that the children's peak is the supervisor's own, not a fork's copy
    done = subprocess.run([PYTHON, "-c", _HUGE_OUTPUT_PEAK, str(tmp_path)], capture_output=True, text=True,
                          env=python_child_env(), timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    assert measured["children_mb"] < 100 and measured["stdout_chars"] < 100_000
    assert measured["tail"].endswith("end\n")


def test_a_huge_output_keeps_the_memory_of_the_tool_call_bounded(tmp_path):
    measured = peak_growth_of_tool_call(tmp_path, "run_command",
                                        {"command": "head -c 100000000 /dev/zero | tr '\\0' x"})
    assert measured["ok"] and measured["grown_mb"] < 100, measured["grown_mb"]


def test_the_head_and_tail_of_a_long_output_are_kept_with_the_count_dropped(tmp_path):
    command = "echo first; head -c 1000000 /dev/zero | tr '\\0' x; echo; echo last"
    result = run_command(tmp_path, command, timeout=60, max_output_chars=1_000_000)
    assert result.output.startswith("exit code: 0\n--- stdout ---\nfirst\nxxx")
    assert result.output.endswith("xxx\nlast")
    assert "bytes of output dropped here" in result.output and len(result.output) < 100_000


def test_a_long_output_cut_by_the_toolbox_keeps_its_last_lines(tmp_path):
    result = run_command(tmp_path, "seq 1 100000", timeout=60, max_output_chars=2000)
    assert result.truncated and "cut from the middle" in result.output
    assert result.output.splitlines()[2] == "1" and result.output.splitlines()[-1] == "100000"
