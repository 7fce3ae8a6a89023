"""What each harness agent asked the model and got back, as the server saw it (swarm/server/exchanges.py):
every request and its reply in the agent's JSONL transcript, and the counts the run reports and limits.

    <run>/agent-<name>.jsonl    {"t", "event": "started", "api", "request_id", "request", "prompt_tokens"}
                                {"t", "event": "finished", "finish_reason", "text", "tool_calls",
                                 "prompt_tokens", "cached_tokens", "generated_tokens", "error"}

The server calls it on its event loop; a line is written and flushed at once, so a transcript is whole
however the run ends. `over_limit` names the agents past their requests or generated-token budget.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from swarm.run.transcript import transcript_path
from swarm.server.exchanges import ExchangeFinished, ExchangeStarted


@dataclass(slots=True)
class AgentCounts:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: list[int] = field(default_factory=list)   # one a finished request, in order
    generated_tokens: int = 0
    in_flight: dict[str, int] = field(default_factory=dict)   # engine request id -> prompt tokens, not answered yet
    last: tuple[int, int, int] | None = None             # the last answered: prompt, cached, generated tokens

    def to_json(self) -> dict:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": sum(self.cached_tokens), "cached_tokens_per_request": list(self.cached_tokens),
                "generated_tokens": self.generated_tokens}


class ExchangeLog:
    def __init__(self, run_dir: Path, agents: list[str], max_requests: int, max_generated: int,
                 start_time: float | None = None):
        self.run_dir = run_dir
        self.counts = {name: AgentCounts() for name in agents}
        self.agent_of: dict[str, str] = {}
        """engine request id -> agent, for every request started."""
        self.max_requests, self.max_generated = max_requests, max_generated
        self.start_time = time.monotonic() if start_time is None else start_time
        self._files: dict[str, TextIO] = {}

    def started(self, record: ExchangeStarted) -> None:
        counts = self.counts.get(record.agent)
        if counts is None:
            return
        self.agent_of[record.request_id] = record.agent
        counts.requests += 1
        counts.in_flight[record.request_id] = record.prompt_tokens
        counts.prompt_tokens += record.prompt_tokens
        self._write(record.agent, record.to_json())

    def finished(self, record: ExchangeFinished) -> None:
        counts = self.counts.get(record.agent)
        if counts is None:
            return
        counts.in_flight.pop(record.request_id, None)
        counts.cached_tokens.append(record.cached_tokens)
        counts.last = (record.prompt_tokens, record.cached_tokens, record.generated_tokens)
        counts.generated_tokens += record.generated_tokens
        self._write(record.agent, record.to_json())

    def over_limit(self) -> dict[str, str]:
        """agent -> why it must stop: its requests or its generated tokens are used up."""
        reasons = {}
        for name, counts in self.counts.items():
            if counts.requests >= self.max_requests and not counts.in_flight:
                reasons[name] = "max_turns"
            elif counts.generated_tokens >= self.max_generated:
                reasons[name] = "max_tokens"
        return reasons

    def close(self) -> None:
        for file in self._files.values():
            file.close()

    def _write(self, agent: str, fields: dict) -> None:
        file = self._files.get(agent)
        if file is None:
            file = self._files[agent] = transcript_path(self.run_dir, agent).open("a", encoding="utf-8")
        line = {"t": round(time.monotonic() - self.start_time, 4), **fields}
        file.write(json.dumps(line, ensure_ascii=False) + "\n")
        file.flush()
