"""One harness CLI (Claude Code, Codex, ...) running as an agent: its process, its logs, and a stop
that leaves none of the processes it started.

    swarm run ── start_new_session ──> harness: its own session and process group
                                         ├─ what it starts: in its group, below it
                                         └─ what calls setsid (a shell tool's `setsid cmd &`): outside
                                            the group, below it while its parents live, orphaned after

The harness gets exactly the environment it is given, plus SWARM_HARNESS_ID, a token of its own
that every process it starts inherits. A stop finds the tree three ways, so that a process that
leaves the group (setsid) or the tree (its parent exited, init adopted it) is still found:
the process group, the descendants in /proc, and the processes whose environment carries the token
(the way Jenkins' ProcessTreeKiller finds a build's daemons). Only a process that both daemonized
and cleared its environment escapes.

stop(grace): SIGTERM to all of them, up to `grace` seconds for them to end, then SIGKILL to what is
left until nothing is. `stop_all` does it for many harnesses at once: every SIGTERM first, one grace
period for all, then the SIGKILLs. Both are safe to call again, and after the harness exited.

Its stdout and stderr go to two files beside the agent's transcript, `<run>/agent-<name>.stdout.log`
and `.stderr.log`; stdin is /dev/null. `exit_code` is Popen's: the harness's exit status, or minus
the signal that ended it (-15 after a SIGTERM it did not handle, -9 after the SIGKILL).
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

from swarm.agents.command_supervisor import descendants as descendants_with_state
from swarm.run.transcript import transcript_path

TOKEN_VARIABLE = "SWARM_HARNESS_ID"
STOP_CHECK_INTERVAL = 0.05  # seconds between checks whether a stopped tree has ended
KILL_PATIENCE = 2.0  # seconds to keep SIGKILLing (a process in D state dies late)


def harness_log_paths(run_dir: Path, agent: str) -> tuple[Path, Path]:
    """`<run>/agent-<name>.stdout.log` and `.stderr.log`, beside the agent's transcript."""
    transcript = transcript_path(run_dir, agent)
    return transcript.with_suffix(".stdout.log"), transcript.with_suffix(".stderr.log")


class HarnessProcess:
    def __init__(self, agent: str, argv: Sequence[str], env: dict[str, str], cwd: Path, run_dir: Path):
        assert argv, "a harness needs a command line"
        self.agent = agent
        self.argv = list(argv)
        self.env = dict(env)
        self.cwd = Path(cwd)
        self.stdout_path, self.stderr_path = harness_log_paths(Path(run_dir), agent)
        self.token = f"{agent}-{secrets.token_hex(8)}"
        self._popen: subprocess.Popen | None = None
        self._signalled: set[int] = set()   # every pid a stop signalled: it waits until none of them runs

    def start(self) -> "HarnessProcess":
        assert self._popen is None, f"harness process {self.agent} started twice"
        env = {**self.env, TOKEN_VARIABLE: self.token}
        with open(self.stdout_path, "ab") as stdout, open(self.stderr_path, "ab") as stderr:
            self._popen = subprocess.Popen(self.argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL,
                                           stdout=stdout, stderr=stderr, start_new_session=True)
        return self

    @property
    def pid(self) -> int | None:
        return None if self._popen is None else self._popen.pid

    @property
    def exit_code(self) -> int | None:
        """None while the harness runs (or before it started)."""
        return self.poll()

    def poll(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code once the harness exits; None if it still runs after `timeout` seconds."""
        if self._popen is None:
            return None
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 5.0) -> int | None:
        """Ends the harness and every process it started; returns its exit code."""
        stop_all([self], grace)
        return self.exit_code

    def running_tree(self) -> set[int]:
        """The processes this harness started that still run (zombies left out), itself included."""
        if self._popen is None:
            return set()
        below = {pid for pid, state in descendants_with_state(self._popen.pid) if state != "Z"}
        return below | processes_carrying(TOKEN_VARIABLE, self.token)

    def terminate(self) -> None:
        self._signal_tree(signal.SIGTERM)

    def wait_gone(self, deadline: float) -> bool:
        """Waits, up to `deadline` (time.monotonic), for the harness and its tree to end."""
        while not self._gone():
            if time.monotonic() >= deadline:
                return False
            time.sleep(STOP_CHECK_INTERVAL)
        return True

    def kill(self) -> set[int]:
        """SIGKILLs the tree until none of it runs; returns the pids still running after KILL_PATIENCE."""
        give_up = time.monotonic() + KILL_PATIENCE
        while not self._gone():
            left = self._signal_tree(signal.SIGKILL)
            if time.monotonic() >= give_up:
                return left
            time.sleep(0.005)
        return set()

    def _gone(self) -> bool:
        """The harness reaped and none of its tree running, nor of the processes a stop signalled: while one exits,
        its environment reads empty before it is a zombie, so the token no longer finds it."""
        return self._popen is None or (self.poll() is not None and not self.running_tree()
                                       and not any(map(_running, self._signalled)))

    def _signal_tree(self, signum: int) -> set[int]:
        """Signals the group and every process of the tree; returns the tree it found."""
        if self._popen is None:
            return set()
        tree = self.running_tree()
        self._signalled |= tree
        group = self._popen.pid
        signalled_group = self._popen.returncode is None  # not reaped: the group's id is still its own
        if signalled_group:
            _send(os.killpg, group, signum)
        for pid in tree:
            # One signal each: a second SIGTERM can reach a process that is already exiting, after
            # its handler is gone, and some CLIs take a second one as "quit at once".
            if not (signalled_group and _group_of(pid) == group):
                _send(os.kill, pid, signum)
        return tree


def stop_all(processes: Sequence[HarnessProcess], grace: float = 5.0) -> set[int]:
    """Stops many harnesses in one grace period: all SIGTERMs, then the wait, then the SIGKILLs.
    Returns the pids that survived even SIGKILL (normally none)."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        process.wait_gone(deadline)
    survivors: set[int] = set()
    for process in processes:
        survivors |= process.kill()
    return survivors


def processes_carrying(variable: str, value: str) -> set[int]:
    """The pids whose environment (as they were started) holds `variable=value`."""
    wanted = f"{variable}={value}".encode()
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and wanted in _environment(name):
            found.add(int(name))
    return found


def _environment(pid: str) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or another user's
        return []


def _running(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _send(kill: Callable[[int, int], None], target: int, signum: int) -> None:
    try:
        kill(target, signum)
    except (ProcessLookupError, PermissionError):
        pass
