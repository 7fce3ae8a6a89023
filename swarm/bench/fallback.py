"""llama.cpp as a `swarm bench` peer that survives its own crash. It runs as it ships (its CPU
"extra buffer types" on: on a machine where its AMX path works, that is its fast path); when its
worker process is killed by a signal in a measurement, a fresh worker on its plain CPU path takes
that measurement again and every later one, and `note` says so in the peer's rows:

    worker, as it ships ── run ──▶ crashed (exit code -11)
                                     └─▶ close it; worker, plain CPU path ── the same run ──▶ ...
                                           note = "plain CPU path: its default path crashed, exit code -11"

A crash of the plain worker too is raised as the first was: the bench reports it as that row's error.
"""
from __future__ import annotations

from dataclasses import replace

from swarm.bench.peers import PeerUnavailable
from swarm.bench.process import PeerProcess, PeerSpec, WorkerCrashed
from swarm.bench.workload import Measurement, Workload


class PlainPathFallback:
    def __init__(self, spec: PeerSpec):
        self.name = spec.name
        self.note = ""   # why it is not running as it ships, for its rows' label
        self._spec = spec
        self._process = PeerProcess(spec)
        self.version = self._process.version

    @property
    def pid(self) -> int:
        return self._process.pid

    def run(self, workload: Workload) -> Measurement:
        try:
            return self._process.run(workload)
        except WorkerCrashed as crash:
            if not self._spec.extra_buffer_types:
                raise
            self._restart_on_plain_path(crash)
        return self._process.run(workload)

    def close(self) -> None:
        self._process.close()

    def _restart_on_plain_path(self, crash: WorkerCrashed) -> None:
        self._process.close()
        self._spec = replace(self._spec, extra_buffer_types=False)
        self.note = f"plain CPU path: its default path crashed, exit code {crash.exit_code}"
        try:
            self._process = PeerProcess(self._spec)
        except PeerUnavailable as err:
            raise WorkerCrashed(f"{crash}; its plain CPU path then did not load: {err}", crash.exit_code) from None
