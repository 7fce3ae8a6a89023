"""`swarm bench --busy K`: K processes that each keep one core busy, as an IDE or a browser
would, while a measurement runs beside them.

Each one is a Python loop that spins until it is killed. `BusyLoad` returns only once all
are spinning, and kills and reaps them on the way out, Ctrl-C and errors included. Should
the bench itself die without cleaning up (SIGKILL, a crash in C), each spinner sees that it
has been handed to another parent and exits on its own.
"""
from __future__ import annotations

import os
import subprocess
import sys

# argv[1]: the pid to outlive no longer. One byte on stdout says the loop has started.
SPIN = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)   # Ctrl-C in the terminal ends it quietly
parent = int(sys.argv[1])
os.write(1, b"1")
while os.getppid() == parent:
    for _ in range(100_000):
        pass
"""


class BusyLoad:
    """`with BusyLoad(k) as load:` k spinning processes (pids in load.pids) for the block's duration."""

    def __init__(self, processes: int):
        assert processes >= 0
        self.processes = processes
        self._spinners: list[subprocess.Popen] = []

    @property
    def pids(self) -> list[int]:
        return [spinner.pid for spinner in self._spinners]

    def __enter__(self) -> BusyLoad:
        try:
            for _ in range(self.processes):
                self._spinners.append(_start_spinner())
            for spinner in self._spinners:
                assert spinner.stdout.read(1) == b"1", f"busy process {spinner.pid} did not start"
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_) -> None:
        self.stop()

    def stop(self) -> None:
        for spinner in self._spinners:
            spinner.kill()
        for spinner in self._spinners:
            spinner.wait()
            spinner.stdout.close()
        self._spinners = []


def _start_spinner() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SPIN, str(os.getpid())], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE)
