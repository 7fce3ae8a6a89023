"""Each `swarm bench` peer (transformers, llama.cpp) runs in a worker process of its own, so it runs
as its users run it: nothing swarm's engine sets for its own process reaches it (the allocator
thresholds of engine/host_memory.py sped transformers up by a tenth when it shared the process;
the OpenMP settings of engine/cpu_threads.py are left out of its environment).
The systems still take turns: a worker computes only while the bench waits on it.

    bench process                          worker process (one a peer)
    PeerProcess(PeerSpec)  ── spec ─────▶  make_peer(spec) -> ("ready", version) | ("unavailable", why)
    .run(workload)         ── workload ─▶  runner.run(workload) -> ("ok", Measurement) | ("error", why)
    .close()               ── None ─────▶  returns

Times are taken inside the worker, so the pipe's copies are not in them. A worker killed by a signal
(llama.cpp's AMX path segfaults on some machines) raises WorkerCrashed in the bench, never takes it down.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from engine import ModelConfig, ModelSource, environment_without_ours
from swarm.bench.peers import PeerUnavailable
from swarm.bench.workload import SYSTEMS, Measurement, Workload

CLOSE_TIMEOUT_S = 30

@dataclass(frozen=True, slots=True)
class PeerSpec:
    name: str                # "hf" or "llamacpp"
    source: ModelSource
    config: ModelConfig
    device: str
    hf_dtype: str
    max_kv_tokens: int
    max_seqs: int
    extra_buffer_types: bool = True   # llama.cpp's repacked weights (its AMX path); off: its plain CPU path


class WorkerCrashed(RuntimeError):
    """The worker process was killed by a signal (a crash), not a Python exception it reported."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def make_peer(spec: PeerSpec):
    """The peer's runner, in this process."""
    if spec.name == "hf":
        from swarm.bench.peers import HFRunner
        return HFRunner(spec.source, torch.device(spec.device), spec.hf_dtype)
    from swarm.bench.llamacpp import LlamaCppRunner
    return LlamaCppRunner(spec.source, spec.config, torch.device(spec.device), spec.max_kv_tokens, spec.max_seqs,
                          spec.extra_buffer_types)


class PeerProcess:
    """A peer runner living in its own worker process (`python -m swarm.bench.process`, talking
    pickles over a pair of pipes); raises PeerUnavailable as make_peer would."""

    note = ""   # as it ships

    def __init__(self, spec: PeerSpec):
        self.name = spec.name
        worker_reads, self._send = _pipe()
        self._receive_end, worker_writes = _pipe()
        ends = (worker_reads.fileno(), worker_writes.fileno())
        root = str(Path(__file__).parents[2])
        env = {**environment_without_ours(),
               "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
        self._process = subprocess.Popen([sys.executable, "-m", "swarm.bench.process", *map(str, ends)],
                                         pass_fds=ends, env=env)
        worker_reads.close()
        worker_writes.close()
        self._busy = False   # a workload is out: on close, the worker is stopped, not waited for
        try:
            self._send.send(spec)
            status, detail = self._receive()
        except RuntimeError as err:
            self.close()
            raise PeerUnavailable(str(err)) from None
        if status != "ready":
            self.close()
            raise PeerUnavailable(detail)
        self.version = detail

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def busy(self) -> bool:
        """A workload is out: `close` then stops the worker instead of waiting for it."""
        return self._busy

    def run(self, workload: Workload) -> Measurement:
        self._busy = True
        try:
            self._send.send(workload)
        except OSError:
            self._ended()
        status, detail = self._receive()
        self._busy = False
        if status != "ok":
            raise RuntimeError(detail)
        return detail

    def close(self) -> None:
        """Ends the worker: at once when it is still computing (the bench was interrupted)."""
        if self._busy:
            self._process.kill()
        if self._process.poll() is None:
            try:
                self._send.send(None)
            except OSError:
                pass
            try:
                self._process.wait(CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._send.close()
        self._receive_end.close()

    def _receive(self):
        try:
            return self._receive_end.recv()
        except (EOFError, OSError):
            self._ended()

    def _ended(self):
        try:
            code = self._process.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        message = f"the {SYSTEMS[self.name]} worker process ended (exit code {code})"
        if code is not None and code < 0:
            raise WorkerCrashed(message, code)
        raise RuntimeError(message)


def _pipe() -> tuple[Connection, Connection]:
    """A pipe's (read end, write end), as connections that carry pickled objects."""
    read, write = os.pipe()
    return Connection(read, writable=False), Connection(write, readable=False)


def _serve(inbox: Connection, outbox: Connection) -> None:
    try:
        _answer(inbox, outbox)
    except (EOFError, BrokenPipeError):   # the bench is gone (interrupted, say): nothing to report to
        pass


def _answer(inbox: Connection, outbox: Connection) -> None:
    spec = inbox.recv()
    try:
        runner = make_peer(spec)
    except PeerUnavailable as err:
        outbox.send(("unavailable", str(err)))
        return
    outbox.send(("ready", runner.version))
    while (workload := inbox.recv()) is not None:
        try:
            outbox.send(("ok", runner.run(workload)))
        except Exception as err:   # reported in the bench's table as this system's error
            outbox.send(("error", f"{type(err).__name__}: {err}".splitlines()[0]))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the bench's to handle: it then stops this worker
    _serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
