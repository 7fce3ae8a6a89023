"""Shared by the tests of the tools' processes: is a pid still running, and waits on a state
(a file appearing, a process gone) with a generous bound that only guards against a hang."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

HANG_GUARD = 30.0  # seconds; reaching it means the property failed, never that the box was slow
REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def is_running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def pids_in(file: Path) -> list[int]:
    return [int(word) for word in file.read_text().split()]


def wait_for(condition: Callable[[], bool], guard: float = HANG_GUARD) -> bool:
    give_up = time.monotonic() + guard
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.02)
    return True


def wait_for_pids(file: Path, count: int = 1) -> list[int]:
    """The pids a command wrote into `file` once it has written `count` of them."""
    assert wait_for(lambda: file.exists() and len(file.read_text().split()) >= count), f"no pids in {file}"
    return pids_in(file)


def kill_leftover_sleeps(pids: list[int]) -> None:
    """Cleans up after a failed test; only a `sleep`, so that a reused pid is left alone."""
    for pid in pids:
        try:
            if is_running(pid) and Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0"):
                os.kill(pid, 9)
        except (FileNotFoundError, ProcessLookupError):
            pass


def call_with_guard(function: Callable[[], object], guard: float = HANG_GUARD) -> object:
    """`function()` in a daemon thread; fails the test if it has not returned after `guard`."""
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(function()), daemon=True)
    thread.start()
    thread.join(guard)
    assert not thread.is_alive(), f"the call did not return within {guard} s"
    assert outcome, "the call raised (see the thread's traceback above)"
    return outcome[0]


def python_child_env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))


# Runs one ToolBox call in a fresh Python and prints how much its peak RSS (VmHWM) grew during
# the call: clear_refs "5" resets the peak to the current RSS (Linux 4.0+) after the imports.
_TOOL_CALL_PEAK = """
import json, sys
from swarm.agents.tool_calls import ToolCall
from swarm.agents.tools import ToolBox
from swarm.agents.workspace import Workspace

def status_kb(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))

root, name, arguments = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
box = ToolBox(Workspace(root), allow_commands=True)
box.run(ToolCall("list_dir", {}, raw=""))
with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")
before = status_kb("VmHWM")
result = box.run(ToolCall(name, arguments, raw=""))
print(json.dumps({"grown_mb": (status_kb("VmHWM") - before) / 1024, "ok": result.ok, "output": result.output}))
"""


def peak_growth_of_tool_call(root: Path, name: str, arguments: dict) -> dict:
    """{"grown_mb", "ok", "output"} of the call `name(**arguments)` run in a child Python."""
    done = subprocess.run([PYTHON, "-c", _TOOL_CALL_PEAK, str(root), name, json.dumps(arguments)],
                          capture_output=True, text=True, env=python_child_env(), timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


BIG_FILE_LINES = 126_000  # of 1,000 bytes: a 126 MB text file


def write_big_text_file(file: Path) -> None:
    """126 MB of 1,000-byte lines; the last one says NEEDLE."""
    block = (b"x" * 999 + b"\n") * 1000
    with open(file, "wb") as out:
        for _ in range(BIG_FILE_LINES // 1000 - 1):
            out.write(block)
        out.write(block[:-1000] + b"NEEDLE" + b"x" * 993 + b"\n")
