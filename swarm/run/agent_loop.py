"""The agents' loop, the same on every backend: hand what the backend reports of each turn to its
agent, run the tool calls a finished turn asks for in a thread of their own, and send the results
back as the agent's next turn, while the other agents go on.

    start          every transcript begins; each first turn is sent (where facts.leader_first,
                   the others follow once the first agent has its first token)
    resume_agents  finished tool work goes back to the model through the backend
    advance        poll the backend (one engine step, or what a server streamed) and dispatch;
                   with no turn in flight, wait a moment for tools instead
    stop_agents    stop the turns in flight; each agent ends, keeping what it wrote of its turn
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable

from swarm.agents.agent import Agent, AgentState, ToolJob
from swarm.agents.progress import TurnEvent
from swarm.agents.throughput import Throughput
from swarm.run.backend import ContextFull, FirstTurn, RunBackend

TOOL_POLL_SECONDS = 0.05


class AgentLoop:
    def __init__(self, backend: RunBackend, agents: list[Agent], clock: Callable[[], float] = time.monotonic):
        self.backend = backend
        self.agents = agents
        self.clock = clock
        self.by_name = {agent.name: agent for agent in agents}
        self.followers: list[Agent] = []
        self.finished_tools: queue.Queue[tuple[Agent, ToolJob]] = queue.Queue()
        self.throughput = Throughput()
        """Tokens a second over all agents."""

    @property
    def done(self) -> bool:
        return all(agent.ended for agent in self.agents)

    def start(self, first_turns: dict[str, FirstTurn]) -> None:
        for index, agent in enumerate(self.agents):
            agent.start(first_turns[agent.name].messages)
            if index and self.backend.facts.leader_first:
                self.followers.append(agent)
            else:
                self.begin(agent)

    def begin(self, agent: Agent) -> None:
        events = self.backend.begin(agent)
        agent.on_submitted()
        self.dispatch(events, self.clock())

    def advance(self) -> None:
        if self.backend.has_work():
            events = self.backend.poll(TOOL_POLL_SECONDS)
            now = self.clock()
            jobs = self.dispatch(events, now)
            self.throughput.add(now, sum(event.tokens for event in events))
            for agent, job in jobs:
                self._run_tools(agent, job)
        else:
            self._wait_for_tools()
        self._begin_followers()

    def dispatch(self, events: list[TurnEvent], now: float) -> list[tuple[Agent, ToolJob]]:
        """Hands each event to its agent; the tool work the finished turns ask for."""
        jobs = []
        for event in events:
            agent = self.by_name[event.agent]
            job = agent.handle(event, now)
            if agent.ended:
                self.backend.release(agent)
            elif job is not None:
                jobs.append((agent, job))
        return jobs

    def resume_agents(self) -> None:
        while True:
            try:
                agent, job = self.finished_tools.get_nowait()
            except queue.Empty:
                return
            self.resume(agent, job)

    def resume(self, agent: Agent, job: ToolJob) -> None:
        """The tools of `job` ran: their results go back to the model, which goes on."""
        if agent.state is not AgentState.TOOL:
            return  # ended while its tools ran (wall time, Ctrl-C)
        try:
            appended = self.backend.extend(agent, job)
        except ContextFull:
            agent.record_results(job, appended_tokens=0)
            self.backend.release(agent)
            agent.fail("context_full")
            return
        agent.on_results(job, appended)

    def stop_agents(self, reason: str) -> None:
        """Ends every agent still running. A second signal may have cut a step in half: even then
        every transcript gets its `end` event."""
        try:
            self.dispatch(self.backend.stop_turns(), self.clock())
        except Exception as err:
            for agent in self.agents:
                self._stopping_failed(agent, reason, err)
        for agent in self.agents:
            if not agent.ended:
                try:
                    self._stop(agent, reason)
                except Exception as err:  # a half-finished step must not cost the transcript its end
                    self._stopping_failed(agent, reason, err)

    def _stop(self, agent: Agent, reason: str) -> None:
        agent.cut_turn(self.backend.partial(agent), reason)
        self.backend.release(agent)
        agent.stop(reason)

    @staticmethod
    def _stopping_failed(agent: Agent, reason: str, err: Exception) -> None:
        if not agent.ended:
            agent.record_end(AgentState.ERROR, reason, f"stopping failed: {type(err).__name__}: {err}")

    def _begin_followers(self) -> None:
        leader = self.agents[0]
        if not self.followers or (leader.first_token_at is None and not leader.ended):
            return
        followers, self.followers = self.followers, []
        for agent in followers:
            if not agent.ended:
                self.begin(agent)

    def _run_tools(self, agent: Agent, job: ToolJob) -> None:
        def work() -> None:
            self.finished_tools.put((agent, job.run_safely(agent.toolbox)))

        threading.Thread(target=work, name=f"tools-{agent.name}", daemon=True).start()

    def _wait_for_tools(self) -> None:
        try:
            agent, job = self.finished_tools.get(timeout=TOOL_POLL_SECONDS)
        except queue.Empty:
            return
        self.resume(agent, job)
