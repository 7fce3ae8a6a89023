"""`swarm run` with an external harness: N copies of a real CLI (Claude Code, Codex, ...) as agents, on
one engine served in this process.

    load the model -> serve it on a loopback port, one key per agent (swarm/server/app.py)
    -> the first agent alone until its trunk request is answered: its trunk (tools, system text) is
       computed once and sits in the prefix cache -> the others, whose first requests start with it;
       what the first two share is pinned (swarm/run/harness_trunk.py)
    -> wait: every CLI exits, or wall_time, a signal, or an agent past max_turns requests or
       max_tokens generated tokens (that agent's CLI is stopped); the view shows each agent's state,
       requests, cached tokens and KV (swarm/cli/harness_dashboard.py), read a few times a second
    -> stop every CLI's process tree; summary.json and the transcripts (swarm/run/exchange_log.py)

No reply gets more than `sampling.max_tokens` tokens, whatever its CLI asks (Claude Code asks for
32,000). Each agent's requests and replies are in `agent-<name>.jsonl`, what its CLI printed beside it, and its
exit code in the summary. Where no mount namespace puts every workspace at one path, the server
canonicalizes the requests (`swarm serve --canonicalize`) so the cwd in them does not split the trunk.
"""
from __future__ import annotations

import queue
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from engine import AsyncEngine, KVStats, LLMEngine
from swarm.run.exchange_log import ExchangeLog
from swarm.run.external_launch import AgentLaunch, agent_keys, prepare_launches
from swarm.run.harness_agents import HarnessFigures, HarnessRunInfo, agent_row
from swarm.run.harness_process import stop_all
from swarm.run.harness_trunk import HarnessTrunk
from swarm.run.memory import TRUNK_REQUEST_ID, MemorySnapshot, RunMemory, by_agent
from swarm.run.setup import engine_options
from swarm.run.stop_flag import StopFlag
from swarm.run.summary import write_summary
from swarm.run.workspace_mount import MOUNT_NAMESPACE, mount_namespace_available
from swarm.server.app import build_app
from swarm.server.loopback import BackgroundServer, bind
from swarm.server.served_model import ServedModel
from swarm.spec.kv_budget import format_bytes
from swarm.spec.schema import SwarmSpec

POLL_SECONDS = 0.1
KV_READ_SECONDS = 0.25
FINAL_READ_TIMEOUT = 30.0
STOP_GRACE = 5.0
WORKSPACE_PATHS = {True: "one path (mount namespace)", False: "each agent's own (requests canonicalized)"}


class HarnessView(Protocol):
    """swarm/cli/harness_dashboard.py: the live table, or plain lines."""
    def say(self, text: str) -> None: ...
    def start(self, info: HarnessRunInfo) -> None: ...
    def update(self, figures: HarnessFigures) -> None: ...
    def close(self, summary: dict) -> None: ...


class ExternalRun:
    def __init__(self, spec: SwarmSpec, run_dir: Path, view: HarnessView, stop: StopFlag):
        self.spec, self.run_dir, self.view, self.stop = spec, run_dir, view, stop
        self.start = time.monotonic()
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.names = [agent.name for agent in spec.agents]
        self.log = ExchangeLog(run_dir, self.names, spec.limits.max_turns, spec.limits.max_tokens, self.start)
        self.memory = RunMemory(MemorySnapshot(), self.names)
        self.launches: list[AgentLaunch] = []
        self.ends: dict[str, str] = {}
        self.engine: AsyncEngine | None = None
        self.server: BackgroundServer | None = None
        self.trunk: HarnessTrunk | None = None
        self._readings: queue.SimpleQueue[KVStats] = queue.SimpleQueue()
        self._read_ids: frozenset[int] = frozenset()
        self._last_read = 0.0

    def run(self) -> dict:
        status, error = "completed", ""
        try:
            self._open()
            self._launch_all()
            status = self._wait()
        except Exception as err:   # the harnesses are stopped and the summary written either way
            status, error = "error", f"{type(err).__name__}: {err}"
            raise
        finally:
            summary = self._close(status, error)
        return summary

    def _open(self) -> None:
        spec = self.spec
        engine = LLMEngine(spec.model, engine_options(spec))
        self.context = engine.config.max_position_embeddings
        self.engine = AsyncEngine(engine)
        self.engine.watch_steps(self._read_kv)
        self.engine.start()
        self.keys = agent_keys(spec)
        self.model = engine.source.display_name
        self.trunk = HarnessTrunk(self.engine, self.names, spec.external.trunk)
        self.engine.watch_steps(self.trunk.after_step)
        canonicalize = not mount_namespace_available()
        app = build_app(self.engine, ServedModel(self.model), agent_keys={key: name for name, key in self.keys.items()},
                        exchanges=[self.log, self.trunk], canonicalize=canonicalize,
                        max_output_tokens=spec.sampling.max_tokens)
        self.server = BackgroundServer(app, bind("127.0.0.1", 0)).start()
        self.view.start(self._run_info(engine, canonicalize))

    def _run_info(self, engine: LLMEngine, canonicalize: bool) -> HarnessRunInfo:
        spec, weights = self.spec, engine.weights
        dtype = str(engine.dtype).removeprefix("torch.")
        return HarnessRunInfo(self.run_dir.name, self.model, str(engine.device), dtype,
                              f"weights {format_bytes(weights.total_bytes)} · {weights.label}", spec.external.name,
                              spec.external.api, len(spec.agents), self.server.url,
                              WORKSPACE_PATHS[not canonicalize])

    def _launch_all(self) -> None:
        self.launches = prepare_launches(self.spec, self.run_dir, self.keys, self.server.url, self.model,
                                         self.context, self.spec.sampling.max_tokens)
        first, *rest = self.launches
        self._start(first)
        while not self.trunk.ready.is_set() and first.process.poll() is None and not self._stopping():
            self._refresh()
            time.sleep(POLL_SECONDS)
        for launch in rest:
            if not self._stopping():
                self._start(launch)

    def _wait(self) -> str:
        deadline = self.start + self.spec.limits.wall_time
        while any(launch.process.poll() is None for launch in self.launches):
            if self.stop.requested:
                return "interrupted"
            if time.monotonic() > deadline:
                self._end_running("wall_time")
                return "wall_time"
            self._stop_over_limit()
            self._refresh()
            time.sleep(POLL_SECONDS)
        return "completed"

    def _stopping(self) -> bool:
        return self.stop.requested or time.monotonic() > self.start + self.spec.limits.wall_time

    def _start(self, launch: AgentLaunch) -> None:
        launch.process.start()
        self.view.say(f"{launch.agent} started: pid {launch.process.pid} in {launch.seen_workspace}")

    def _stop_over_limit(self) -> None:
        over = self.log.over_limit()
        for launch in self.launches:
            reason = over.get(launch.agent)
            if reason and launch.agent not in self.ends and launch.process.poll() is None:
                self.ends[launch.agent] = reason
                stop_all([launch.process], STOP_GRACE)
                self.view.say(f"{launch.agent} stopped: {reason}")

    def _end_running(self, reason: str) -> None:
        running = [launch for launch in self.launches if launch.process.poll() is None]
        self.ends.update({launch.agent: reason for launch in running if launch.agent not in self.ends})
        stop_all([launch.process for launch in running], STOP_GRACE)

    def _close(self, status: str, error: str) -> dict:
        with self.stop.shielded():
            self._end_running("interrupted" if status in ("interrupted", "error") else "stopped")
            if self.server is not None:
                self.server.stop()
            self._final_reading()
            if self.engine is not None:
                self.engine.shutdown()
            self.log.close()
            summary = self._summary(status, error)
            write_summary(self.run_dir, summary)
        self.view.close(summary)
        return summary

    def _read_kv(self, engine: LLMEngine) -> None:
        """In the engine thread, after a step: a reading whenever a request is new since the last one, so
        that every request and every peak of sharing is seen, else a few times a second."""
        ids, now = frozenset(engine.live), time.monotonic()
        if ids - self._read_ids or now - self._last_read >= KV_READ_SECONDS:
            self._readings.put(engine.kv_stats())
            self._read_ids, self._last_read = ids, now

    def _refresh(self) -> None:
        while True:
            try:
                self._observe(self._readings.get_nowait())
            except queue.Empty:
                break
        self.view.update(self._figures())

    def _observe(self, stats: KVStats) -> None:
        self.memory.observe_engine(by_agent(stats, {**self.log.agent_of, TRUNK_REQUEST_ID: TRUNK_REQUEST_ID}))
        self.memory.set_trunk(self.trunk.tokens, len(self.trunk.blocks))

    def _final_reading(self) -> None:
        """What the engine holds once every CLI is gone: the pinned trunk, and what is cached."""
        if self.engine is None or not self.engine.is_alive:
            return
        try:
            self._readings.put(self.engine.call(lambda engine: engine.kv_stats()).result(FINAL_READ_TIMEOUT))
        except TimeoutError:
            pass   # the summary keeps the last reading
        self._refresh()

    def _figures(self) -> HarnessFigures:
        rows = [agent_row(launch.agent, launch.process, self.log.counts[launch.agent],
                          self.memory.agents[launch.agent], self.ends.get(launch.agent)) for launch in self.launches]
        return HarnessFigures(rows, self.memory)

    def _summary(self, status: str, error: str) -> dict:
        confinement = {launch.confinement for launch in self.launches} or {"none"}
        return {"status": status, "run": self.run_dir.name, "run_dir": str(self.run_dir), "spec": str(self.spec.path),
                "started_at": self.started_at, "model": getattr(self, "model", None),
                "harness": self.spec.external.name, "api": self.spec.external.api,
                "workspace_path": WORKSPACE_PATHS[confinement == {MOUNT_NAMESPACE}],
                "seconds": round(time.monotonic() - self.start, 3), "error": error,
                "trunk": self.trunk.to_json(self.memory.block_bytes) if self.trunk else None,
                "memory": self.memory.engine_dict(),
                "agents": [self._agent(launch) for launch in self.launches]}

    def _agent(self, launch: AgentLaunch) -> dict:
        process = launch.process
        ended = self.ends.get(launch.agent, "exited" if process.pid else "not_started")
        kv = self.memory.agents[launch.agent]
        return {"name": launch.agent, "exit_code": process.exit_code, "end_reason": ended,
                **self.log.counts[launch.agent].to_json(),
                "peak_shared_bytes": kv.peak_shared_bytes, "peak_private_bytes": kv.peak_private_bytes,
                "workspace": str(launch.workspace.root), "seen_workspace": launch.seen_workspace,
                "confinement": launch.confinement, "transcript": f"agent-{launch.agent}.jsonl",
                "stdout": process.stdout_path.name, "stderr": process.stderr_path.name}
