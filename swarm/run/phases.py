"""One swarm run, on either backend (swarm/run/backend.py): open it once, share the trunk once,
then drive every agent through its turns until each is done.

    open (load the model, or check the server) -> set up the agents -> share the trunk (swarm's
    engine: prefill it and pin it) -> the agents' loop (swarm/run/agent_loop.py) -> finish

The run owns the phases, the wall time, Ctrl-C, the view, the transcripts and summary.json; the
backend owns how turns travel and where the KV figures come from. Only this thread touches the
backend; tools run in daemon threads.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from engine import SwarmError
from swarm.agents.agent import Agent, AgentEvent
from swarm.agents.command_runner import kill_running_commands
from swarm.run.agent_loop import AgentLoop
from swarm.run.backend import FirstTurn, RunBackend
from swarm.run.memory import RunMemory
from swarm.run.setup import SwarmGround, make_agents, prepare_ground
from swarm.run.stop_flag import StopFlag
from swarm.run.summary import RunInfo, RunTimings, build_summary, write_summary
from swarm.run.transcript import TranscriptWriter
from swarm.run.view import RunView
from swarm.spec.schema import SwarmSpec

REFRESH_SECONDS = 0.25


class Interrupted(Exception):
    pass


def run_phases(phases: list[Callable[[], None]], finish: Callable[[str, str], None], stop: StopFlag) -> None:
    """Runs the phases in order, then always `finish(status, error)`, shielded from signals:
    completed, interrupted (Ctrl-C, SIGTERM), or failed (the error is re-raised after finishing)."""
    status, error = "failed", ""
    try:
        for phase in phases:
            phase()
        status = "completed"
    except (Interrupted, KeyboardInterrupt):
        status = "interrupted"
    except SwarmError as err:
        error = str(err)
        raise
    except BaseException as err:
        error = f"{type(err).__name__}: {err}"
        raise
    finally:
        with stop.shielded():
            kill_running_commands()  # the calls in flight return as stopped; nothing they started is left
            finish(status, error)


def run_status(status: str, agents: list[Agent]) -> str:
    """The run's status for the summary: `completed` says every agent finished on its own, so a
    run whose agents `wall_time` cut short says `wall_time` instead."""
    if status == "completed" and any(agent.end_reason == "wall_time" for agent in agents):
        return "wall_time"
    return status


def backend_for(spec: SwarmSpec) -> RunBackend:
    """The spec's backend: swarm's own engine, or an OpenAI-compatible server. Each is imported
    only when chosen: the engine's brings torch, the server's the openai client."""
    if spec.backend.is_remote:
        from swarm.run.openai_backend import OpenAIBackend
        return OpenAIBackend(spec)
    from swarm.run.local_backend import LocalBackend
    return LocalBackend(spec)


class SwarmRun:
    def __init__(self, spec: SwarmSpec, run_dir: Path, view: RunView, stop: StopFlag | None = None,
                 backend: RunBackend | None = None):
        self.spec = spec
        self.view = view
        self.stop = stop or StopFlag()
        self.backend = backend or backend_for(spec)
        self.clock = time.monotonic
        self.start_time = self.clock()
        self.info = RunInfo(name=run_dir.name, run_dir=run_dir, spec_path=str(spec.path),
                            started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            facts=self.backend.facts)
        self.backend.describe(self.info)
        self.timings = RunTimings()
        self.transcripts = TranscriptWriter(run_dir, self.start_time)
        self.ground: SwarmGround | None = None
        self.first_turns: dict[str, FirstTurn] = {}
        self.agents: list[Agent] = []
        self.loop: AgentLoop | None = None
        self.last_refresh = 0.0
        self.summary: dict = {}

    @property
    def memory(self) -> RunMemory:
        return self.backend.memory

    def run(self) -> dict:
        """Runs to the end, the wall time or a signal; the summary is written either way and returned."""
        self._write_summary("running")
        run_phases([self._open, self._set_up, self._share_trunk, self._run_agents], self._finish, self.stop)
        return self.summary

    # --- phases -----------------------------------------------------------------------------

    def _open(self) -> None:
        started = self.clock()
        self.backend.open(self.info, self.timings, self.view.note)
        self.timings.load_seconds = self.clock() - started
        self._check_stop()

    def _set_up(self) -> None:
        self.ground = prepare_ground(self.spec, self.info.run_dir)
        self.first_turns = self.backend.set_up(self.spec, self.ground, self.info, self.view.note)
        prompt_tokens = {name: turn.prompt_tokens for name, turn in self.first_turns.items()}
        self.agents = make_agents(self.spec, self.ground, prompt_tokens, self.backend.max_context,
                                  self.backend.facts.cached_tokens, self._on_event)
        self.loop = AgentLoop(self.backend, self.agents, self.clock)
        self.view.start(self.info, self.agents, self.memory)

    def _share_trunk(self) -> None:
        started = self.clock()
        tokens = self.backend.share_trunk(before_step=self._check_stop, after_step=self._refresh)
        if tokens is None:
            return
        self.timings.trunk_seconds = self.clock() - started
        self.backend.sample_memory()
        self.view.note(f"trunk prefilled: {tokens} tokens in {self.timings.trunk_seconds:.1f} s, "
                       f"shared by {len(self.agents)} agents")

    def _run_agents(self) -> None:
        started = self.clock()
        self.loop.start(self.first_turns)
        deadline = started + self.spec.limits.wall_time
        try:
            while not self.loop.done:
                self._check_stop()
                self.loop.resume_agents()
                if self.clock() > deadline:
                    self.backend.sample_memory()  # before the agents give their KV back: the peaks are here
                    self.loop.stop_agents("wall_time")
                    break
                self.loop.advance()
                self._refresh()
        finally:
            self.timings.agents_seconds = self.clock() - started
        self.backend.agents_ended()

    def _finish(self, status: str, error: str) -> None:
        if self.loop is not None:
            self._settle_agents("interrupted" if status == "interrupted" else "error")
        self._close_backend()
        self.timings.wall_seconds = self.clock() - self.start_time
        self.summary = self._write_summary(run_status(status, self.agents), error)
        self.transcripts.close()
        self.view.close(self.summary)

    # --- small parts ------------------------------------------------------------------------

    def _settle_agents(self, reason: str) -> None:
        """Ends every agent still running, with the KV figures read first: the peaks are there."""
        try:
            self.backend.sample_memory()
        except Exception as err:
            self.view.note(f"the KV figures could not be read at the end: {type(err).__name__}: {err}")
        self.loop.stop_agents(reason)

    def _close_backend(self) -> None:
        try:
            self.backend.close()
        except Exception as err:  # the results are what matters now
            self.view.note(f"closing the backend failed: {type(err).__name__}: {err}")

    def _refresh(self) -> None:
        now = self.clock()
        if now - self.last_refresh < REFRESH_SECONDS:
            return
        self.last_refresh = now
        self.backend.sample_memory()
        self.view.refresh(self.loop.throughput.rate(now))

    def _on_event(self, event: AgentEvent) -> None:
        self.transcripts.write(event)
        self.view.event(event)

    def _check_stop(self) -> None:
        if self.stop.requested:
            raise Interrupted()

    def _write_summary(self, status: str, error: str = "") -> dict:
        workspaces = {name: str(ws.root) for name, ws in (self.ground.workspaces if self.ground else {}).items()}
        summary = build_summary(self.info, status, self.agents, self.memory, self.timings, workspaces, error)
        write_summary(self.info.run_dir, summary)
        return summary
