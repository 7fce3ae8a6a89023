"""The trunk of an external harness's agents: the prompt their first requests start with, computed once
and pinned once it is known, so that no agent's growing context evicts it.

    the first agent's trunk request        computed alone: the other agents start when it is answered
                                           (`ready`), so their first requests find it cached
    the second agent's trunk request       the tokens the two have in common, in whole KV blocks, is
                                           the trunk: its cached blocks are pinned (computing nothing)

An agent's trunk request is its first request, or with the template's `trunk: first-request-with-tools`
its first request that carries tools (OpenCode first asks for a session title, without them).
With one agent, its trunk request is pinned whole once it is answered.

Called on the server's event loop (swarm/server/exchanges.py): the pin is handed to the engine's
thread (AsyncEngine.call) and never waited for there.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future

from engine import AsyncEngine
from swarm.server.exchanges import ExchangeFinished, ExchangeStarted

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
        self._pin: Future | None = None

    def started(self, record: ExchangeStarted) -> None:
        if record.agent not in self.agents or record.agent in self.requests or not self._is_trunk_request(record):
            return
        self.requests[record.agent] = record.request_id
        self.prompts[record.agent] = record.prompt_ids
        if self._pin is None and len(self.prompts) == 2:
            self._pin_common_prefix()

    def finished(self, record: ExchangeFinished) -> None:
        if self.requests.get(record.agent) != record.request_id or record.agent != self._first_agent():
            return
        self.ready.set()
        if len(self.agents) == 1 and self._pin is None:   # computed now: pinned whole
            self._pin_common_prefix()

    def wait_pinned(self, timeout: float = 30.0) -> None:
        """Waits for the pin to be made (the engine thread runs it between steps)."""
        if self._pin is not None:
            self._pin.result(timeout)

    def to_json(self, block_bytes: int) -> dict:
        return {"source": self.source, "tokens": self.tokens, "blocks": len(self.blocks),
                "bytes": len(self.blocks) * block_bytes, "pinned": bool(self.blocks), "from_agents": self.pinned_from}

    def unpin(self) -> None:
        """Gives the pinned blocks back (the run is over)."""
        blocks, self.blocks = self.blocks, []
        if blocks:
            self.engine.call(lambda engine: engine.unpin(blocks))

    def _is_trunk_request(self, record: ExchangeStarted) -> bool:
        return self.source != WITH_TOOLS or bool(record.request.get("tools"))

    def _first_agent(self) -> str | None:
        return next(iter(self.requests), None)

    def _pin_common_prefix(self) -> None:
        self.pinned_from = list(self.prompts)
        common = common_prefix(list(self.prompts.values()))
        self._pin = self.engine.call(lambda engine: self._pinned(engine.pin_cached_prefix(common),
                                                                 engine.blocks.block_size))

    def _pinned(self, blocks: list[int], block_size: int) -> None:
        self.blocks, self.tokens = blocks, len(blocks) * block_size


def common_prefix(prompts: list[list[int]]) -> list[int]:
    """The tokens every prompt starts with."""
    first, *others = prompts
    length = len(first)
    for other in others:
        length = next((i for i, (a, b) in enumerate(zip(first[:length], other)) if a != b), min(length, len(other)))
    return first[:length]
