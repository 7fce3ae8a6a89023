"""The supervisor of one run_command call: the process that owns everything the command starts.

swarm/agents/command_runner.py starts it as `python -I -S command_supervisor.py` (a few standard
modules only, so that it starts fast), writes a request to its stdin and reads a report from its
stdout, both dicts in `marshal` form (the same interpreter on both sides; json would cost the
import of `re`, most of the start-up time):

    swarm (a tool thread) ── request, report ──> supervisor: a child subreaper, own session
                                                   └─ /bin/sh -c COMMAND: own session
                                                        └─ what it starts: &, setsid, nohup, ...

As a child subreaper (prctl PR_SET_CHILD_SUBREAPER) the supervisor adopts every orphan below
it, so no process leaves its tree by daemonizing; setsid and double forks only leave a process
group. Once the shell exits, the deadline passes, or a stop is asked (SIGTERM, which swarm's
exit also sends through PR_SET_PDEATHSIG), it SIGKILLs every descendant until none is left,
collects the output still in the pipes and reports. Output is read as it comes into a bounded
buffer: its head and tail, and a count of the bytes dropped between. Only a SIGKILL of the
supervisor itself leaves the command's processes behind (swarm sends one only to a supervisor
that has not finished 2 s after it was asked to stop).
"""
from __future__ import annotations

import ctypes
import marshal
import os
import selectors
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
READ_CHUNK_BYTES = 1 << 16
DRAIN_GRACE = 0.2  # seconds to collect output still in the pipes once the processes are gone
KILL_PATIENCE = 2.0  # seconds to keep killing descendants (a process in D state dies late)


class BoundedOutput:
    """The first `head_limit` and the last `tail_limit` bytes of a stream, and how many between
    were dropped."""

    def __init__(self, head_limit: int, tail_limit: int):
        self.head_limit, self.tail_limit = head_limit, tail_limit
        self.head, self.tail = bytearray(), bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > 2 * self.tail_limit:  # trimmed in batches, not on every chunk
            del self.tail[:-self.tail_limit]

    def text(self) -> str:
        tail = self.tail[-self.tail_limit:] if self.tail_limit else b""
        dropped = self.total - len(self.head) - len(tail)
        middle = f"\n[... {dropped} bytes of output dropped here ...]\n" if dropped else ""
        return self.head.decode("utf-8", errors="replace") + middle + tail.decode("utf-8", errors="replace")


class Signals:
    """SIGCHLD and stop requests (SIGTERM, SIGHUP, SIGINT), each waking the select loop."""

    def __init__(self):
        self.wake, writer = os.pipe()
        os.set_blocking(self.wake, False)
        os.set_blocking(writer, False)
        signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
        self.stop_requested = False
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for stop in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(stop, self._request_stop)

    def _request_stop(self, *_) -> None:
        self.stop_requested = True

    def clear(self) -> None:
        try:
            while os.read(self.wake, 4096):
                pass
        except BlockingIOError:
            pass


class Children:
    """Reaps every child that ended (the shell, and orphans adopted as a subreaper)."""

    def __init__(self, shell_pid: int):
        self.shell_pid = shell_pid
        self.shell_exit_code: int | None = None

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.shell_pid:
                self.shell_exit_code = os.waitstatus_to_exitcode(status)


def main() -> None:
    _adopt_orphans_and_die_with_parent()
    signals = Signals()
    request = sys.stdin.buffer.read()
    if not request:  # swarm went away before it sent the command
        return
    sys.stdout.buffer.write(marshal.dumps(supervise(marshal.loads(request), signals)))
    sys.stdout.flush()


def supervise(request: dict, signals: Signals) -> dict:
    outputs = [BoundedOutput(request["head_bytes"], request["tail_bytes"]) for _ in range(2)]
    report = {"ending": "stopped", "exit_code": None, "leftovers": 0, "stdout": "", "stderr": ""}
    if signals.stop_requested or os.getppid() != request["parent_pid"]:  # swarm ended meanwhile
        return report
    os.chdir(request["cwd"])
    shell_pid, pipes = _start_shell(request["command"])
    selector = selectors.DefaultSelector()
    selector.register(signals.wake, selectors.EVENT_READ, None)
    for pipe, output in zip(pipes, outputs, strict=True):
        selector.register(pipe, selectors.EVENT_READ, output)
    children = Children(shell_pid)
    report["ending"] = _wait_for_shell(children, selector, signals, request["deadline"])
    report["leftovers"] = kill_descendants(children)
    _drain(selector, signals, time.monotonic() + DRAIN_GRACE)
    report["exit_code"] = children.shell_exit_code if report["ending"] == "exited" else None
    report["stdout"], report["stderr"] = (output.text() for output in outputs)
    return report


def _adopt_orphans_and_die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for option, value in ((PR_SET_CHILD_SUBREAPER, 1), (PR_SET_PDEATHSIG, int(signal.SIGTERM))):
        if libc.prctl(option, value, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


def _start_shell(command: str) -> tuple[int, tuple[int, int]]:
    stdout_read, stdout_write = os.pipe()
    stderr_read, stderr_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        _exec_shell(command, stdout_write, stderr_write)
    os.close(stdout_write)
    os.close(stderr_write)
    return pid, (stdout_read, stderr_read)


def _exec_shell(command: str, stdout: int, stderr: int) -> None:
    try:
        os.setsid()
        for restored in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; commands expect them
            signal.signal(restored, signal.SIG_DFL)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        os.execv("/bin/sh", ["/bin/sh", "-c", command])
    except BaseException as err:
        os.write(2, f"swarm: could not start /bin/sh: {err}\n".encode())
    finally:
        os._exit(127)


def _wait_for_shell(children: Children, selector: selectors.BaseSelector, signals: Signals,
                    deadline: float) -> str:
    while True:
        children.reap()
        if children.shell_exit_code is not None:
            return "exited"
        if signals.stop_requested:
            return "stopped"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timed_out"
        _pump(selector, signals, remaining)


def _pump(selector: selectors.BaseSelector, signals: Signals, timeout: float) -> None:
    for key, _ in selector.select(timeout):
        if key.data is None:
            signals.clear()
            continue
        chunk = os.read(key.fd, READ_CHUNK_BYTES)
        if chunk:
            key.data.add(chunk)
        else:
            selector.unregister(key.fd)
            os.close(key.fd)


def _drain(selector: selectors.BaseSelector, signals: Signals, until: float) -> None:
    """Reads what is left in the pipes, up to `until`: a process outside the tree (one the
    command handed its pipe to) could keep them open for ever."""
    while any(key.data is not None for key in selector.get_map().values()):
        remaining = until - time.monotonic()
        if remaining <= 0:
            return
        _pump(selector, signals, remaining)


def kill_descendants(children: Children) -> int:
    """SIGKILLs every process below this one until none is left; returns how many were running."""
    running: set[int] = set()
    give_up = time.monotonic() + KILL_PATIENCE
    while time.monotonic() < give_up:
        found = descendants(os.getpid())
        if not found:
            break
        for pid, state in found:
            if state != "Z" and pid != children.shell_pid:
                running.add(pid)
            _kill(pid)
        children.reap()
        time.sleep(0.005)
    return len(running)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def descendants(ancestor: int) -> list[tuple[int, str]]:
    """Every process below `ancestor`, with its state letter, from /proc."""
    children_of: dict[int, list[tuple[int, str]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (entry := _stat_entry(name)):
            state, parent = entry
            children_of.setdefault(parent, []).append((int(name), state))
    found, frontier = [], [ancestor]
    while frontier:
        below = children_of.get(frontier.pop(), [])
        found += below
        frontier += [pid for pid, _ in below]
    return found


def _stat_entry(pid: str) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    state, parent = stat[stat.rindex(b")") + 2:].split(b" ", 2)[:2]  # the name may hold spaces
    return state.decode(), int(parent)


if __name__ == "__main__":
    main()
