"""A run on an OpenAI-compatible server (vLLM, SGLang, `swarm serve`): each agent's conversation is
a message list, re-sent in full every turn as one streamed chat request.

    open        check the server and its model; read its /metrics once
    set_up      every agent gets the same system message (the trunk's rules) and the same `tools`
                in canonical order; everything volatile is in its first user message
    begin       the first agent's turn goes alone; the others follow at its first token (the run
                does that, facts.leader_first): by then the server has the shared prefix cached
    poll        the pieces and turn ends the streams have put on a queue
    extend      the assistant message and one `tool` message per result, then the next turn

The server's chat template renders a byte-identical prefix for every agent, so its prefix cache
hits, and since messages only grow, each turn also hits on all of the previous one; each turn's
usage says how many prompt tokens it found cached. Tool calls come as structured `tool_calls`
(servers with a tool parser) or as `<tool_call>` text; either way each result goes back as a
`tool` message answering its call's id.

The requests run on an asyncio loop in a thread of the backend's own; the run's thread only
submits to it and reads the queue. Cancelling a turn closes its stream, which cancels the
request on the server. /metrics is read once a second while the agents run.
"""
from __future__ import annotations

import asyncio
import hashlib
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Callable, Coroutine

import httpx

from engine import SamplingParams
from swarm.agents.agent import Agent
from swarm.agents.progress import PartialTurn, Reply, ToolJob, TurnEvent
from swarm.run.backend import FirstTurn, Note
from swarm.run.facts import OPENAI_FACTS
from swarm.run.memory import RunMemory
from swarm.run.openai_client import AssistantReply, ChatClient, ContextFullError, RemoteError
from swarm.run.server_metrics import ServerMetrics, scrape
from swarm.run.setup import SwarmGround
from swarm.run.summary import RunInfo, RunTimings
from swarm.spec.schema import SwarmSpec
from swarm.spec.tool_schema import canonical_json
from swarm.trunk.canonical import agent_rules_text
from swarm.trunk.suffix import first_user_message

METRICS_SECONDS = 1.0


@dataclass(slots=True)
class Conversation:
    """One agent's side of the server: what every request of it sends, and the turn in flight."""

    messages: list[dict]
    tools: list[dict]
    reply: AssistantReply | None = None
    """The turn in flight, filled in as its stream arrives (so a cancelled turn keeps its text)."""
    finished: AssistantReply | None = None
    """The last finished turn, whose message goes back with the results."""
    task: asyncio.Task | None = field(default=None, repr=False)

    @property
    def prefix_sha256(self) -> str:
        """sha256 of what every request of the agent starts with: its system message and its tools."""
        return hashlib.sha256(canonical_json([self.messages[0], self.tools]).encode()).hexdigest()


class OpenAIBackend:
    facts = OPENAI_FACTS
    max_context = None  # the server refuses what does not fit

    def __init__(self, spec: SwarmSpec, client: ChatClient | None = None):
        """`client`: one to use instead of a ChatClient on the spec's backend (tests)."""
        self.spec = spec
        self.server = spec.backend
        self.client = client
        self.memory = RunMemory(ServerMetrics(), metrics_url=self.server.metrics_url)
        self.conversations: dict[str, Conversation] = {}
        self.events: queue.Queue[TurnEvent] = queue.Queue()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.http: httpx.AsyncClient | None = None
        self.watcher: asyncio.Task | None = None

    def describe(self, info: RunInfo) -> None:
        info.model, info.device, info.base_url = self.server.model, "remote", self.server.base_url

    def open(self, info: RunInfo, timings: RunTimings, note: Note) -> None:
        note(f"connecting to {self.server.base_url} ({self.server.model})")
        if self.spec.ignored_keys:
            note(f"{', '.join(self.spec.ignored_keys)}: ignored with backend {self.server.type} "
                 "(the server sets its own)")
        self._call(self._connect())

    def set_up(self, spec: SwarmSpec, ground: SwarmGround, info: RunInfo, note: Note) -> dict[str, FirstTurn]:
        tools = [segment.tool for segment in ground.source.tools]
        rules = [segment.text for segment in ground.source.rules]
        turns = {}
        for agent in spec.agents:
            environment = ground.environments[agent.name]
            messages = [{"role": "system", "content": agent_rules_text(rules, agent, environment)},
                        {"role": "user", "content": first_user_message(agent, environment)}]
            turns[agent.name] = self.add_agent(agent.name, messages, tools)
        prefixes = [conversation.prefix_sha256 for conversation in self.conversations.values()]
        info.trunk_sha256 = prefixes[0]
        if len(set(prefixes)) > 1:
            note("the agents' system messages differ ({{ variables }} in rules): the server's cache "
                 "shares them only up to the first difference")
        return turns

    def add_agent(self, name: str, messages: list[dict], tools: list[dict]) -> FirstTurn:
        """An agent whose requests start with `messages` and offer `tools`; what its transcript begins with."""
        self.conversations[name] = Conversation(list(messages), tools)
        names = [tool["function"]["name"] for tool in tools]
        return FirstTurn([{**message, **({"tools": names} if message["role"] == "system" else {})}
                          for message in messages])

    def share_trunk(self, before_step: Callable[[], None], after_step: Callable[[], None]) -> None:
        return None  # the leader's first turn puts it in the server's cache (facts.leader_first)

    def begin(self, agent: Agent) -> list[TurnEvent]:
        if self.watcher is None and self.http is not None:  # from the first turn on; open read the counters
            self._call(self._watch_metrics())
        self._start_turn(agent)
        return []

    def has_work(self) -> bool:
        return not self.events.empty() or any(conversation.task is not None and not conversation.task.done()
                                              for conversation in self.conversations.values())

    def poll(self, timeout: float) -> list[TurnEvent]:
        try:
            events = [self.events.get(timeout=timeout)] if timeout > 0 else []
        except queue.Empty:
            return []
        while not self.events.empty():
            events.append(self.events.get_nowait())
        return events

    def extend(self, agent: Agent, job: ToolJob) -> None:
        conversation = self.conversations[agent.name]
        conversation.messages.append(conversation.finished.message())
        conversation.messages += [{"role": "tool", "tool_call_id": call_id, "content": output}
                                  for call_id, output in zip(job.call_ids, job.outputs)]
        self._start_turn(agent)
        return None  # known from the next turn's usage

    def stop_turns(self) -> list[TurnEvent]:
        if self.loop is not None:
            self._call(self._cancel_turns())
        return self.poll(0)

    def partial(self, agent: Agent) -> PartialTurn | None:
        conversation = self.conversations.get(agent.name)
        reply = conversation.reply if conversation is not None else None
        return PartialTurn(reply.content, reply.pieces) if reply is not None else None

    def release(self, agent: Agent) -> None:
        pass  # the server keeps nothing of an agent but its prefix cache

    def sample_memory(self) -> None:
        pass  # read once a second by the watcher

    def agents_ended(self) -> None:
        self._call(self._last_metrics())

    def close(self) -> None:
        if self.loop is None:
            return
        self._call(self._shut_down())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()
        self.loop = None

    # --- on the backend's loop --------------------------------------------------------------

    async def _connect(self) -> None:
        self.client = self.client or ChatClient(self.server)
        self.http = httpx.AsyncClient()
        await self.client.check_model()
        await self._read_metrics()  # the counters start from here

    def _start_turn(self, agent: Agent) -> None:
        conversation = self.conversations[agent.name]
        conversation.reply = AssistantReply()
        params = replace(agent.turn_params(), stop=[])
        self._call(self._spawn(agent.name, conversation, params))

    async def _spawn(self, name: str, conversation: Conversation, params: SamplingParams) -> None:
        conversation.task = asyncio.create_task(self._turn(name, conversation, params))

    async def _turn(self, name: str, conversation: Conversation, params: SamplingParams) -> None:
        reply = conversation.reply
        try:
            await self.client.stream_turn(conversation.messages, conversation.tools, params, reply,
                                          lambda count: self._on_pieces(name, reply, count))
        except ContextFullError as err:
            self.events.put(TurnEvent(name, "failed", reason="context_full", error=str(err)))
            return
        except RemoteError as err:
            self.events.put(TurnEvent(name, "failed", reason="error", error=str(err)))
            return
        if not reply.pieces:   # an empty reply (the first token ended it): its prompt was computed all the same
            self.events.put(TurnEvent(name, "prefilled"))
        conversation.reply, conversation.finished = None, reply
        self.events.put(TurnEvent(name, "turn_end", reply=Reply(
            reply.content, reply.finish_reason, reply.tokens, prompt_tokens=reply.prompt_tokens,
            cached_tokens=reply.cached_tokens, tool_calls=reply.message().get("tool_calls"))))

    def _on_pieces(self, name: str, reply: AssistantReply, count: int) -> None:
        if reply.pieces == count:  # the turn's first pieces (counted in): the server has computed the prompt
            self.events.put(TurnEvent(name, "prefilled"))
        self.events.put(TurnEvent(name, "tokens", tokens=count))

    async def _cancel_turns(self) -> None:
        tasks = [c.task for c in self.conversations.values() if c.task is not None and not c.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch_metrics(self) -> None:
        async def watch() -> None:
            while True:
                await asyncio.sleep(METRICS_SECONDS)
                await self._read_metrics()
        self.watcher = asyncio.create_task(watch())

    async def _last_metrics(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
        await self._read_metrics()

    async def _read_metrics(self) -> None:
        self.memory.observe(*await scrape(self.http, self.memory.metrics_url))

    async def _shut_down(self) -> None:
        await self._cancel_turns()
        if self.watcher is not None:
            self.watcher.cancel()
            await asyncio.gather(self.watcher, return_exceptions=True)
        if self.client is not None:
            await self.client.close()
        if self.http is not None:
            await self.http.aclose()

    def _call(self, work: Coroutine):
        """Runs `work` on the backend's loop, started on first use, and waits for it."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            self.thread = threading.Thread(target=self.loop.run_forever, name="openai-backend", daemon=True)
            self.thread.start()
        future: Future = asyncio.run_coroutine_threadsafe(work, self.loop)
        return future.result()
