"""One swarm run on a remote OpenAI-compatible server (vLLM, SGLang, `swarm serve`).

    check the server and its model -> set up workspaces and agents -> run every agent as a task
    loop (4 times a second): Ctrl-C or SIGTERM? wall time? -> refresh the view
    beside it: read the server's /metrics once a second

Every agent is an asyncio task holding one streamed request at a time; tools run in threads.
The first agent's first request goes alone and the others follow as soon as its first token
arrives: by then the server has the shared prefix (system message and tools) in its cache, so
it computes it once, as the local engine prefills the trunk once.
"""
from __future__ import annotations

import asyncio
import hashlib
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from swarm.agents.progress import AgentEvent
from swarm.cli.plain_view import RunView
from swarm.run.openai_client import ChatClient
from swarm.run.phases import Interrupted, run_phases, run_status
from swarm.run.remote_agent import RemoteAgent
from swarm.run.server_memory import ServerMemory, scrape
from swarm.run.setup import SwarmGround, prepare_ground, sampling_params
from swarm.run.stop_flag import StopFlag
from swarm.run.summary import RunInfo, RunTimings, build_remote_summary, write_summary
from swarm.run.transcript import TranscriptWriter
from swarm.spec.schema import SwarmSpec
from swarm.spec.tool_schema import canonical_json
from swarm.trunk.canonical import agent_rules_text
from swarm.trunk.suffix import first_user_message

REFRESH_SECONDS = 0.25
METRICS_SECONDS = 1.0


class RemoteSwarmRun:
    def __init__(self, spec: SwarmSpec, run_dir: Path, view: RunView, stop: StopFlag | None = None):
        self.spec = spec
        self.backend = spec.backend
        self.view = view
        self.stop = stop or StopFlag()
        self.clock = time.monotonic
        self.start_time = self.clock()
        self.info = RunInfo(name=run_dir.name, run_dir=run_dir, spec_path=str(spec.path), model=self.backend.model,
                            device="remote", started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            backend=self.backend.type, base_url=self.backend.base_url)
        self.timings = RunTimings()
        self.server = ServerMemory(self.backend.metrics_url)
        self.transcripts = TranscriptWriter(run_dir, self.start_time)
        self.ground: SwarmGround | None = None
        self.agents: list[RemoteAgent] = []
        self.summary: dict = {}

    def run(self) -> dict:
        """Runs to the end, the wall time or a signal; the summary is written either way and returned."""
        self._write_summary("running")
        run_phases([lambda: asyncio.run(self._main())], self._finish, self.stop)
        return self.summary

    async def _main(self) -> None:
        client = ChatClient(self.backend)
        try:
            async with httpx.AsyncClient() as http:
                await self._connect(client, http)
                self._set_up()
                await self._run_agents(client, http)
        finally:
            await client.close()

    # --- phases -----------------------------------------------------------------------------

    async def _connect(self, client: ChatClient, http: httpx.AsyncClient) -> None:
        self.view.note(f"connecting to {self.backend.base_url} ({self.backend.model})")
        if self.spec.ignored_keys:
            self.view.note(f"{', '.join(self.spec.ignored_keys)}: ignored with backend {self.backend.type} "
                           "(the server sets its own)")
        started = self.clock()
        await client.check_model()
        self.server.observe(*await scrape(http, self.server.metrics_url))  # counters start from here
        self.timings.load_seconds = self.clock() - started

    def _set_up(self) -> None:
        self.ground = ground = prepare_ground(self.spec, self.info.run_dir)
        tools = [segment.tool for segment in ground.source.tools]
        rules = [segment.text for segment in ground.source.rules]
        for index, agent_spec in enumerate(self.spec.agents):
            environment = ground.environments[agent_spec.name]
            messages = [{"role": "system", "content": agent_rules_text(rules, agent_spec, environment)},
                        {"role": "user", "content": first_user_message(agent_spec, environment)}]
            self.agents.append(RemoteAgent(agent_spec.name, messages, tools, ground.toolbox(self.spec, agent_spec.name),
                                           sampling_params(self.spec, index), self.spec.limits, self._on_event))
        self.info.trunk_sha256 = request_prefix_sha256(self.agents[0])
        if len({request_prefix_sha256(agent) for agent in self.agents}) > 1:
            self.view.note("the agents' system messages differ ({{ variables }} in rules): the server's cache "
                           "shares them only up to the first difference")
        self.view.start(self.info, self.agents, self.server)

    async def _run_agents(self, client: ChatClient, http: httpx.AsyncClient) -> None:
        started = self.clock()
        leader = self.agents[0]
        tasks = [asyncio.create_task(leader.run(client))]
        tasks += [asyncio.create_task(agent.run(client, after=leader.first_token)) for agent in self.agents[1:]]
        watcher = asyncio.create_task(self._watch_metrics(http))
        try:
            await self._supervise(tasks, started + self.spec.limits.wall_time)
        finally:
            watcher.cancel()
            self.timings.agents_seconds = self.clock() - started
        self.server.observe(*await scrape(http, self.server.metrics_url))

    async def _supervise(self, tasks: list[asyncio.Task], deadline: float) -> None:
        pending = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=REFRESH_SECONDS)
            if self.stop.requested:
                await self._stop_agents(tasks, "interrupted")
                raise Interrupted()
            if pending and self.clock() > deadline:
                await self._stop_agents(tasks, "wall_time")
                return
            self._refresh()

    def _finish(self, status: str, error: str) -> None:
        for agent in self.agents:  # only those whose task never ran: the others ended themselves
            agent.stop("interrupted" if status == "interrupted" else "error")
        self.timings.wall_seconds = self.clock() - self.start_time
        self.summary = self._write_summary(run_status(status, self.agents), error)
        self.transcripts.close()
        self.view.close(self.summary)

    # --- small parts ------------------------------------------------------------------------

    async def _stop_agents(self, tasks: list[asyncio.Task], reason: str) -> None:
        """Cancelling a task closes its stream, which cancels its request on the server."""
        for agent, task in zip(self.agents, tasks):
            if not task.done():
                agent.stop_reason = reason
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch_metrics(self, http: httpx.AsyncClient) -> None:
        while True:
            await asyncio.sleep(METRICS_SECONDS)
            self.server.observe(*await scrape(http, self.server.metrics_url))

    def _refresh(self) -> None:
        now = self.clock()
        self.view.refresh(sum(agent.throughput.rate(now) for agent in self.agents if not agent.ended))

    def _on_event(self, event: AgentEvent) -> None:
        self.transcripts.write(event)
        self.view.event(event)

    def _write_summary(self, status: str, error: str = "") -> dict:
        workspaces = {name: str(ws.root) for name, ws in (self.ground.workspaces if self.ground else {}).items()}
        summary = build_remote_summary(self.info, status, self.agents, self.server, self.timings, workspaces, error)
        write_summary(self.info.run_dir, summary)
        return summary


def request_prefix_sha256(agent: RemoteAgent) -> str:
    """sha256 of what every request of the agent starts with: its system message and its tools."""
    return hashlib.sha256(canonical_json([agent.messages[0], agent.tools]).encode()).hexdigest()
