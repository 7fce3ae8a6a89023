"""Running one shell command for a tool call, with every process it starts held to the call.

Each call gets its own supervisor process (swarm/agents/command_supervisor.py explains how it keeps
hold of every process the command starts, even a daemonized one). This side hands it the
command and an absolute deadline, waits for its report, and keeps the supervisors that are
running, so that `kill_running_commands` can stop them all when a run ends. The properties:

- a call returns within its timeout plus about a second (REPORT_GRACE), however the command
  forks, daemonizes or holds its output pipes open;
- when a call returns, no process it started is left: background ones are killed when the
  shell exits, everything at the timeout, and at the latest when swarm exits (the supervisor
  gets SIGTERM through PR_SET_PDEATHSIG even if swarm is killed with SIGKILL);
- memory stays bounded: each stream keeps its first and last OUTPUT_*_BYTES, and the report
  says how many bytes were dropped between.
"""
from __future__ import annotations

import marshal
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SUPERVISOR = Path(__file__).with_name("command_supervisor.py")
OUTPUT_HEAD_BYTES = 32 * 1024  # of each stream, stdout and stderr
OUTPUT_TAIL_BYTES = 32 * 1024
REPORT_GRACE = 0.9  # seconds after the deadline for the supervisor to kill, drain and report
ENDINGS = ("exited", "timed_out", "stopped")

_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class CommandResult:
    ending: str  # one of ENDINGS; "stopped" means kill_running_commands (or swarm's exit) stopped it
    exit_code: int | None  # the shell's, once it exited; negative: the signal that killed it
    stdout: str
    stderr: str
    leftovers: int = 0  # processes still running when the shell exited, killed then


def run_supervised(command: str, cwd: Path, timeout: float) -> CommandResult:
    """Runs `command` with /bin/sh in `cwd`; returns once it and everything it started are gone."""
    assert timeout > 0 and "\x00" not in command, "run_command checks its arguments"
    deadline = time.monotonic() + timeout
    request = {"command": command, "cwd": str(cwd), "deadline": deadline, "parent_pid": os.getpid(),
               "head_bytes": OUTPUT_HEAD_BYTES, "tail_bytes": OUTPUT_TAIL_BYTES}
    supervisor = _start_supervisor()
    try:
        report, stderr = supervisor.communicate(marshal.dumps(request),
                                                timeout=deadline + REPORT_GRACE - time.monotonic())
    except subprocess.TimeoutExpired:
        _abandon(supervisor)
        return CommandResult("timed_out", None, "", "(swarm: the output could not be collected in time)")
    _forget(supervisor)
    return _parse(report, stderr, supervisor.returncode)


def kill_running_commands(patience: float = 2.0) -> int:
    """Stops every command a tool is running, with all the processes it started, and returns how
    many there were. Call it when a run ends; the calls in flight then return as stopped."""
    with _running_lock:
        supervisors = list(_running)
    for supervisor in supervisors:
        supervisor.send_signal(signal.SIGTERM)
    give_up = time.monotonic() + patience
    for supervisor in supervisors:
        try:
            supervisor.wait(timeout=max(0.0, give_up - time.monotonic()))
        except subprocess.TimeoutExpired:
            supervisor.kill()
    return len(supervisors)


def _start_supervisor() -> subprocess.Popen:
    # -I -S: the supervisor needs only the standard library; its own session keeps a Ctrl-C
    # meant for swarm from reaching it (swarm decides when commands stop).
    supervisor = subprocess.Popen([sys.executable, "-I", "-S", str(SUPERVISOR)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    with _running_lock:
        _running.add(supervisor)
    return supervisor


def _forget(supervisor: subprocess.Popen) -> None:
    with _running_lock:
        _running.discard(supervisor)


def _abandon(supervisor: subprocess.Popen) -> None:
    """Lets a supervisor that missed its deadline finish its killing in the background."""
    supervisor.send_signal(signal.SIGTERM)
    for pipe in (supervisor.stdout, supervisor.stderr):
        pipe.close()

    def reap() -> None:
        supervisor.wait()
        _forget(supervisor)
    threading.Thread(target=reap, name="command-supervisor-reaper", daemon=True).start()


def _parse(report: bytes, stderr: bytes, returncode: int) -> CommandResult:
    if not report and returncode < 0:  # killed by kill_running_commands' last resort
        return CommandResult("stopped", None, "", "")
    if returncode != 0 or not report:
        raise RuntimeError(f"the command supervisor failed with exit code {returncode}: "
                           f"{stderr.decode(errors='replace')[-2000:]}")
    fields = marshal.loads(report)
    assert fields["ending"] in ENDINGS, fields["ending"]
    return CommandResult(fields["ending"], fields["exit_code"], fields["stdout"], fields["stderr"],
                         fields["leftovers"])
