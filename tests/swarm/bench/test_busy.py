"""`swarm bench --busy K`'s busy processes (swarm/bench/busy.py): real spinning processes, started
for a measurement and gone after it, whether the bench ends normally, is interrupted or dies.

Whether any outlived their bench is read without timing: the bench runs under a child subreaper,
so any process it leaves behind becomes the subreaper's child, and os.wait() there returns it (or
raises ChildProcessError once there is none)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from swarm.bench.busy import BusyLoad
from tests.helpers.processes import wait_for
from tests.helpers.tiny_models import make_tiny_model

ROOT = Path(__file__).parents[3]
HANG_GUARD_S = 300   # seconds; reaching it means a hang, never a slow machine
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a child subreaper and /proc are Linux's")

# argv: the command to run as the bench, then "interrupt" to send it SIGINT once it has printed a line
REAPER = """
import ctypes, json, os, signal, subprocess, sys
PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
bench = subprocess.Popen(sys.argv[1:-1], stdout=subprocess.PIPE, text=True)
first_line = bench.stdout.readline()
if sys.argv[-1] == "interrupt":
    bench.send_signal(signal.SIGINT)
rest = bench.stdout.read()
code = bench.wait()
outlived = {}
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        break
    outlived[pid] = os.waitstatus_to_exitcode(status)
print(json.dumps({"first_line": first_line, "rest": rest, "code": code, "outlived": outlived}))
"""


def run_under_reaper(command: list[str], then: str = "wait") -> dict:
    done = subprocess.run([sys.executable, "-c", REAPER, *command, then], cwd=ROOT, capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def state(pid: int) -> str | None:
    """The process's state letter (R running, S sleeping, Z exited unreaped); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def cpu_seconds(pid: int) -> float:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])



def test_busy_processes_spin_while_the_block_runs_and_are_gone_after():
    with BusyLoad(2) as load:
        pids = load.pids
        assert len(set(pids)) == 2 and os.getpid() not in pids
        for pid in pids:
            assert state(pid) not in (None, "Z", "T") and parent(pid) == os.getpid()
            assert wait_for(lambda: cpu_seconds(pid) > 0.05, HANG_GUARD_S), "a busy process does not compute"
    assert [state(pid) for pid in pids] == [None, None]   # killed and reaped on the way out


def test_no_busy_processes_for_zero():
    with BusyLoad(0) as load:
        assert load.pids == []


INTERRUPTED = """
import json, signal
from swarm.bench.busy import BusyLoad
signal.signal(signal.SIGINT, signal.default_int_handler)   # a shell's background job starts with SIGINT ignored
try:
    with BusyLoad(2) as load:
        print(json.dumps(load.pids), flush=True)
        signal.pause()
except KeyboardInterrupt:
    print("interrupted")
"""

DIES = """
import json, os
from swarm.bench.busy import BusyLoad
load = BusyLoad(2).__enter__()
print(json.dumps(load.pids), flush=True)
os._exit(1)   # no cleanup, as after a SIGKILL or a crash in C
"""


def test_ctrl_c_ends_the_busy_processes_with_the_bench():
    report = run_under_reaper([sys.executable, "-c", INTERRUPTED], then="interrupt")
    assert len(json.loads(report["first_line"])) == 2
    assert report["rest"].strip() == "interrupted" and report["code"] == 0
    assert report["outlived"] == {}


def test_busy_processes_end_by_themselves_when_the_bench_dies():
    report = run_under_reaper([sys.executable, "-c", DIES])
    pids = json.loads(report["first_line"])
    assert report["code"] == 1
    assert report["outlived"] == {str(pid): 0 for pid in pids}   # each saw its bench gone and exited cleanly


def test_swarm_bench_busy_leaves_no_process_behind(tmp_path):
    swarm = shutil.which("swarm")
    assert swarm, "the swarm command is not installed (pip install -e .)"
    model = make_tiny_model(tmp_path / "llama", "llama")
    out = tmp_path / "bench.json"
    command = [swarm, "bench", "--model", str(model), "--agents", "1", "--trunk", "8", "--suffix", "2",
               "--new-tokens", "3", "--peers", "", "--busy", "2", "--out", str(out)]
    report = run_under_reaper(command)
    assert report["code"] == 0, report
    assert report["outlived"] == {}
    busy = json.loads(out.read_text())["configs"][0]["systems"]["swarm"]["busy"]
    assert (busy["processes"], busy["status"]) == (2, "ok")
