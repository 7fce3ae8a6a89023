"""The trunk of an external harness's agents: the prompt their first requests start with, computed once
and pinned once it is known, so that no agent's growing context evicts it.

    the first agent's trunk request        computed alone: the other agents start when it is answered
                                           (`ready`), so their first requests find it cached
    the second agent's trunk request       the tokens the two have in common is the trunk: a request of
                                           its own, "(trunk)", takes its cached blocks (computing only its
                                           last token) and keeps them, pinned, as `swarm run`'s trunk is

An agent's trunk request is its first request, or with the template's `trunk: first-request-with-tools`
its first request that carries tools (OpenCode first asks for a session title, without them).
With one agent, its trunk request is pinned whole once it is answered.

The trunk's own request makes the accounting that of a built-in run (swarm/run/memory.py): its blocks are
shared whenever an agent's request reads them, and the partly filled last block is the trunk's alone.
The server calls `started` and `finished` on its event loop: the trunk's request is handed to the engine's
thread (AsyncEngine.call), and pinned there after the step that prefilled it (`after_step`, an
AsyncEngine.watch_steps watcher).
"""
from __future__ import annotations

import threading
from concurrent.futures import Future

from engine import AsyncEngine, LLMEngine, SamplingParams, Sequence
from swarm.run.memory import TRUNK_REQUEST_ID
from swarm.server.exchanges import ExchangeFinished, ExchangeStarted
from swarm.trunk.canonical import common_prefix_length

WITH_TOOLS = "first-request-with-tools"


class HarnessTrunk:
    def __init__(self, engine: AsyncEngine, agents: list[str], source: str = "first-request"):
        self.engine, self.agents, self.source = engine, list(agents), source
        self.ready = threading.Event()
        """Set when the first agent's trunk request is answered (however it ended)."""
        self.requests: dict[str, str] = {}
        """agent -> the request id of its trunk request."""
        self.prompts: dict[str, list[int]] = {}
        self.tokens = 0
        self.blocks: list[int] = []
        self.pinned_from: list[str] = []
        self._added: Future | None = None
        self._seq: Sequence | None = None
        self._pinned = threading.Event()

    def started(self, record: ExchangeStarted) -> None:
        if record.agent not in self.agents or record.agent in self.requests or not self._is_trunk_request(record):
            return
        self.requests[record.agent] = record.request_id
        self.prompts[record.agent] = record.prompt_ids
        if self._added is None and len(self.prompts) == 2:
            self._add_trunk()

    def finished(self, record: ExchangeFinished) -> None:
        if self.requests.get(record.agent) != record.request_id or record.agent != self._first_agent():
            return
        self.ready.set()
        if len(self.agents) == 1 and self._added is None:   # computed now: pinned whole
            self._add_trunk()

    def after_step(self, engine: LLMEngine) -> None:
        """Pins the trunk's request once a step has prefilled it."""
        seq = self._seq
        if seq is None or self._pinned.is_set() or seq.finish_reason is None:
            return
        if seq.finish_reason == "prefilled":
            self.blocks, self.tokens = engine.pin(seq), len(seq.token_ids)
        self._pinned.set()

    def wait_pinned(self, timeout: float = 30.0) -> None:
        """Waits for the trunk's request to be added and pinned, where there is one."""
        if self._added is not None:
            self._added.result(timeout)
            self._pinned.wait(timeout)

    def to_json(self, block_bytes: int) -> dict:
        return {"source": self.source, "tokens": self.tokens, "blocks": len(self.blocks),
                "bytes": len(self.blocks) * block_bytes, "pinned": bool(self.blocks), "from_agents": self.pinned_from}

    def _is_trunk_request(self, record: ExchangeStarted) -> bool:
        return self.source != WITH_TOOLS or bool(record.request.get("tools"))

    def _first_agent(self) -> str | None:
        return next(iter(self.requests), None)

    def _add_trunk(self) -> None:
        self.pinned_from = list(self.prompts)
        first, *_ = prompts = list(self.prompts.values())
        common = first[:common_prefix_length(prompts)]
        if common:
            self._added = self.engine.call(lambda engine: self._add(engine, common))

    def _add(self, engine: LLMEngine, trunk_ids: list[int]) -> None:
        self._seq = engine.add_request(trunk_ids, SamplingParams(max_tokens=1), request_id=TRUNK_REQUEST_ID,
                                       prefill_only=True)

