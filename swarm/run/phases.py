"""One swarm run: load the model once, prefill and pin the trunk once, then drive every agent
through the engine's one batched decode loop until each is done.

    load engine -> set up agents -> prefill trunk, pin it -> submit all agents
    loop: collect finished tool work -> engine.step() -> dispatch tokens and turn ends -> view

Tools run in daemon threads (one per turn that calls tools); the loop never waits on them
while any agent can decode. Only this thread touches the engine.
"""
from __future__ import annotations

import queue
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from engine import EngineOptions, LLMEngine, SamplingParams, StepResult, SwarmError
from swarm.agents.agent import Agent, AgentEvent, AgentState, ToolJob
from swarm.agents.command_runner import kill_running_commands
from swarm.agents.progress import AgentProgress
from swarm.agents.throughput import Throughput
from swarm.cli.plain_view import RunView
from swarm.run.memory import TRUNK_REQUEST_ID, SwarmMemory
from swarm.run.setup import SwarmSetup, first_messages, set_up_agents
from swarm.run.stop_flag import StopFlag
from swarm.run.summary import RunInfo, RunTimings, build_summary, write_summary
from swarm.run.transcript import TranscriptWriter
from swarm.spec.schema import SwarmSpec

REFRESH_SECONDS = 0.25
TOOL_POLL_SECONDS = 0.05


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


def run_status(status: str, agents: list[AgentProgress]) -> str:
    """The run's status for the summary: `completed` says every agent finished on its own, so a
    run whose agents `wall_time` cut short says `wall_time` instead."""
    if status == "completed" and any(agent.end_reason == "wall_time" for agent in agents):
        return "wall_time"
    return status


class SwarmRun:
    def __init__(self, spec: SwarmSpec, run_dir: Path, view: RunView, stop: StopFlag | None = None,
                 engine: LLMEngine | None = None):
        self.spec = spec
        self.view = view
        self.stop = stop or StopFlag()
        self.engine = engine
        self.clock = time.monotonic
        self.start_time = self.clock()
        self.info = RunInfo(name=run_dir.name, run_dir=run_dir, spec_path=str(spec.path),
                            started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        self.timings = RunTimings()
        self.memory = SwarmMemory([agent.name for agent in spec.agents])
        self.transcripts = TranscriptWriter(run_dir, self.start_time)
        self.throughput = Throughput()
        self.setup: SwarmSetup | None = None
        self.agents: list[Agent] = []
        self.by_seq: dict[int, Agent] = {}
        self.finished_tools: queue.Queue[tuple[Agent, ToolJob]] = queue.Queue()
        self.last_refresh = 0.0
        self.summary: dict = {}

    def run(self) -> dict:
        """Runs to the end, the wall time or a signal; the summary is written either way and returned."""
        self._write_summary("running")
        run_phases([self._load, self._set_up, self._prefill_trunk, self._run_agents], self._finish, self.stop)
        return self.summary

    # --- phases -----------------------------------------------------------------------------

    def _load(self) -> None:
        self.view.note(f"loading {self.spec.model}")
        started = self.clock()
        if self.engine is None:
            self.engine = LLMEngine(self.spec.model, self._engine_options())
        engine = self.engine
        self.info.model = engine.source.display_name
        self.info.device, self.info.dtype = str(engine.device), str(engine.dtype).removeprefix("torch.")
        self.info.weight_bytes = engine.weight_bytes
        self.timings.load_seconds = self.clock() - started
        self._check_stop()

    def _set_up(self) -> None:
        max_context = self.engine.config.max_position_embeddings
        self.setup = set_up_agents(self.spec, self.engine.tokenizer, max_context, self.info.run_dir, self._on_event)
        self.agents = self.setup.agents
        self.info.trunk_sha256 = self.setup.prompts.trunk.sha256
        self.view.start(self.info, self.agents, self.memory)

    def _prefill_trunk(self) -> None:
        trunk_ids = self.setup.prompts.trunk.token_ids
        max_context = self.engine.config.max_position_embeddings
        if len(trunk_ids) >= max_context:
            raise SwarmError(f"the trunk has {len(trunk_ids)} tokens, the model's context is {max_context}; "
                             "use fewer rules or tools, or a model with a longer context")
        started = self.clock()
        if trunk_ids:
            seq = self.engine.add_request(trunk_ids, SamplingParams(max_tokens=1), request_id=TRUNK_REQUEST_ID,
                                          prefill_only=True)
            while seq.finish_reason is None:
                self._check_stop()
                self._step()
                self._refresh()
            if seq.finish_reason == "error":
                raise SwarmError(f"the trunk does not fit in the KV pool: {seq.error}")
            self.engine.pin(seq)
            self.memory.set_trunk(len(trunk_ids), len(seq.block_table))
        self.timings.trunk_seconds = self.clock() - started
        self._sample_memory()
        self.view.note(f"trunk prefilled: {len(trunk_ids)} tokens in {self.timings.trunk_seconds:.1f} s, "
                       f"shared by {len(self.agents)} agents")

    def _run_agents(self) -> None:
        started = self.clock()
        messages = first_messages(self.setup, self.spec)
        for agent in self.agents:
            agent.start(self.engine, messages[agent.name])
            if agent.seq is not None:
                self.by_seq[agent.seq.seq_id] = agent
        deadline = started + self.spec.limits.wall_time
        while not all(agent.ended for agent in self.agents):
            self._check_stop()
            self._resume_agents()
            if self.clock() > deadline:
                self._sample_memory()  # before the agents give their KV back: the peaks are here
                self._stop_agents("wall_time")
                break
            if self.engine.has_work():
                self._dispatch(self._step())
            else:
                self._wait_for_tools()
            self._refresh()
        self.timings.agents_seconds = self.clock() - started

    def _finish(self, status: str, error: str) -> None:
        if self.engine is not None and self.setup is not None:
            self._settle_agents("interrupted" if status == "interrupted" else "error")
        self.timings.wall_seconds = self.clock() - self.start_time
        self.summary = self._write_summary(run_status(status, self.agents), error)
        self.transcripts.close()
        self.view.close(self.summary)

    # --- the loop ---------------------------------------------------------------------------

    def _step(self) -> StepResult:
        started = time.perf_counter()
        result = self.engine.step()
        seconds = time.perf_counter() - started
        self.timings.steps += 1
        self.timings.step_seconds += seconds
        if result.new_tokens and not result.prefilled:
            self.timings.decode_steps += 1
            self.timings.decode_seconds += seconds
            self.timings.decode_tokens += len(result.new_tokens)
        return result

    def _dispatch(self, result: StepResult) -> None:
        now = self.clock()
        for seq in result.prefilled:
            self._agent(seq.seq_id).on_prefilled()
        for seq, _ in result.new_tokens:
            self._agent(seq.seq_id).on_token(now)
        self.throughput.add(now, len(result.new_tokens))
        if result.finished or result.prefilled:
            self._sample_memory()  # before turn ends release anything: the peaks are here
        for seq in result.finished:
            agent = self._agent(seq.seq_id)
            job = agent.on_turn_end(self.engine)
            if job is not None:
                self._run_tools(agent, job)

    def _run_tools(self, agent: Agent, job: ToolJob) -> None:
        def work() -> None:
            self.finished_tools.put((agent, job.run_safely(agent.toolbox)))

        threading.Thread(target=work, name=f"tools-{agent.name}", daemon=True).start()

    def _resume_agents(self) -> None:
        while True:
            try:
                agent, job = self.finished_tools.get_nowait()
            except queue.Empty:
                return
            agent.resume(self.engine, job)

    def _wait_for_tools(self) -> None:
        try:
            agent, job = self.finished_tools.get(timeout=TOOL_POLL_SECONDS)
        except queue.Empty:
            return
        agent.resume(self.engine, job)

    def _settle_agents(self, reason: str) -> None:
        """Ends every agent still running. A second signal may have cut a step in half: even then
        the summary and every transcript's `end` event get written."""
        try:
            self._sample_memory()
        except Exception as err:
            self.view.note(f"the KV figures could not be read at the end: {type(err).__name__}: {err}")
        self._stop_agents(reason)

    def _stop_agents(self, reason: str) -> None:
        for agent in self.agents:
            if not agent.ended:
                try:
                    agent.stop(self.engine, reason)
                except Exception as err:  # a half-finished step must not cost the transcript its end
                    if not agent.ended:
                        agent.record_end(AgentState.ERROR, reason, f"stopping failed: {type(err).__name__}: {err}")

    def _refresh(self) -> None:
        now = self.clock()
        if now - self.last_refresh < REFRESH_SECONDS:
            return
        self.last_refresh = now
        self._sample_memory()
        self.view.refresh(self.throughput.rate(now))

    # --- small parts ------------------------------------------------------------------------

    def _agent(self, seq_id: int) -> Agent:
        return self.by_seq[seq_id]

    def _on_event(self, event: AgentEvent) -> None:
        self.transcripts.write(event)
        self.view.event(event)

    def _sample_memory(self) -> None:
        self.memory.observe(self.engine.kv_stats())

    def _check_stop(self) -> None:
        if self.stop.requested:
            raise Interrupted()

    def _engine_options(self) -> EngineOptions:
        budget = self.spec.kv_budget
        return EngineOptions(device=self.spec.device, dtype=self.spec.dtype,
                             kv_budget_tokens=budget.tokens if budget else None,
                             kv_budget_bytes=budget.bytes if budget else None)

    def _write_summary(self, status: str, error: str = "") -> dict:
        workspaces = {name: str(ws.root) for name, ws in (self.setup.workspaces if self.setup else {}).items()}
        summary = build_summary(self.info, status, self.agents, self.memory, self.timings, workspaces, error)
        write_summary(self.info.run_dir, summary)
        return summary
